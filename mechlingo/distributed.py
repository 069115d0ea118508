"""Deprecated: moved to :mod:`mechlingo.activations.parallel` (the torchrun primitives),
:mod:`mechlingo.activations.pooled` and :mod:`mechlingo.activations.means`
(mechlingo-shim, removed in 0.2)."""

import warnings

from mechlingo.activations.means import last_token_means as distributed_last_token_means
from mechlingo.activations.parallel import *  # noqa: F403
from mechlingo.activations.parallel import __all__ as _parallel_all
from mechlingo.activations.pooled import (
    pooled_neuron_acts as distributed_pooled_neuron_acts,
)

warnings.warn(
    "mechlingo.distributed moved to mechlingo.activations.parallel (and .pooled, .means); "
    "import it from there (the old path is removed in mechlingo 0.2)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [*_parallel_all, "distributed_last_token_means", "distributed_pooled_neuron_acts"]

"""mechlingo: mechanistic interpretability of multilingual language models on TransformerLens.

Start with :func:`load_model` (the embedded default is google/gemma-3-270m), bundled facts
from :mod:`mechlingo.data`, and :func:`lens_facts` for the per-language logit lens.

The package is layered; each folder imports only from those above it in this list:
``core`` (model, sites, tokens, errors) -> ``kernels`` (readout, ranking, statistics) and
``data`` -> ``activations`` (runs, pooled statistics, decoding) -> ``interventions`` ->
``analyses`` (the methods) -> ``viz`` (figures) -> ``report`` (HTML pages) -> ``cli``.
"""

from __future__ import annotations

from mechlingo import viz  # noqa: F401  (registers the figures of the results' fig_* methods)
from mechlingo.analyses.evaluate import EvalResult, evaluate_facts, greedy_generate
from mechlingo.analyses.lens import LensResult, lens_facts, logit_lens
from mechlingo.core.models import DEFAULT_MODEL, load_model, tiny_model
from mechlingo.core.sites import hook_name, resolve_site
from mechlingo.core.version import __version__
from mechlingo.data import load_facts
from mechlingo.interventions import intervene

__all__ = [
    "DEFAULT_MODEL",
    "EvalResult",
    "LensResult",
    "__version__",
    "evaluate_facts",
    "greedy_generate",
    "hook_name",
    "intervene",
    "lens_facts",
    "load_facts",
    "load_model",
    "logit_lens",
    "resolve_site",
    "tiny_model",
]

"""Interventions as composable hook objects: steering vectors, neuron clamps, ablations.

Each intervention says *what* it does; ``layer``, ``site`` and ``positions`` say *where*.
Add them with ``+`` (:class:`Compose`), apply them with :func:`intervene` or through
``model.hooks(iv.fwd_hooks(model))``, save and reload them with :meth:`Intervention.save` /
:func:`load_intervention` (checked against the model they were built for).
"""

from mechlingo.core.describe import check_model, model_info, model_info_name
from mechlingo.core.errors import InterventionError, ModelMismatchError
from mechlingo.interventions.base import (
    FORMAT_VERSION,
    Ablation,
    Compose,
    Intervention,
    NeuronClamp,
    SteeringVector,
    intervene,
    load_intervention,
    random_like,
)

__all__ = [
    "FORMAT_VERSION",
    "Ablation",
    "Compose",
    "Intervention",
    "InterventionError",
    "ModelMismatchError",
    "NeuronClamp",
    "SteeringVector",
    "check_model",
    "intervene",
    "load_intervention",
    "model_info",
    "model_info_name",
    "random_like",
]

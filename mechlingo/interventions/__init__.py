"""Interventions as composable hook objects: steering vectors, neuron clamps, ablations.

An intervention is an artifact: built once (by hand or with
:mod:`mechlingo.analyses.recall.steering`), saved, loaded, and applied to any run of a model it
fits (checked before a hook is attached). Apply one with :func:`intervene`
(``with intervene(model, iv, batch=b): model(...)``); the analyses take ``intervention=``.

Kinds: :class:`SteeringVector`, :class:`NeuronClamp`, :class:`Ablation` (the one owner of
zeroing), each a :class:`SiteEdit` (the *where*); :class:`Gated` (``iv.only_for(langs)``) and
:class:`Compose` (``a + b``: ``b``'s hook sees ``a``'s result). Save with
:meth:`Intervention.save`, reload with :func:`load_intervention`; :func:`~.export.export` writes
steering vectors for other tools.

Modules: :mod:`~.base`, :mod:`~.steering`, :mod:`~.clamp`, :mod:`~.ablation`, :mod:`~.gate`,
:mod:`~.apply`, :mod:`~.hf`, :mod:`~.export`, :mod:`~.circuit`; the guide: ``docs/interventions.md``."""

from mechlingo.core.describe import check_model, model_info, model_info_name
from mechlingo.core.errors import InterventionError, ModelMismatchError
from mechlingo.interventions.ablation import Ablation
from mechlingo.interventions.apply import first_edit, intervene, intervention_hooks
from mechlingo.interventions.base import (
    FORMAT_VERSION,
    Compose,
    Gated,
    Intervention,
    SiteEdit,
    load_intervention,
)
from mechlingo.interventions.circuit import CircuitAblation
from mechlingo.interventions.clamp import NeuronClamp
from mechlingo.interventions.export import VectorExport, export, read_export
from mechlingo.interventions.hf import HFHandle
from mechlingo.interventions.steering import SteeringVector, random_like

__all__ = [
    "FORMAT_VERSION",
    "Ablation",
    "CircuitAblation",
    "Compose",
    "Gated",
    "HFHandle",
    "Intervention",
    "InterventionError",
    "ModelMismatchError",
    "NeuronClamp",
    "SiteEdit",
    "SteeringVector",
    "VectorExport",
    "check_model",
    "export",
    "first_edit",
    "intervene",
    "intervention_hooks",
    "load_intervention",
    "model_info",
    "model_info_name",
    "random_like",
    "read_export",
]

"""Interventions as composable hook objects: steering vectors, neuron clamps, ablations.

An intervention is an artifact: you build it once (by hand or with :mod:`mechlingo.analyses.repair`),
save it, load it, and apply it to any run of a model it fits. Every intervention has
``fwd_hooks(model)``, which checks it against the model (site, layer, vector size) and returns
a list of ``(hook_name, fn)`` pairs where ``fn(tensor, hook)`` is an ordinary TransformerLens
hook function. So there are three equivalent ways to apply one::

    with mechlingo.intervene(model, a + b):
        logits = model(tokens)

    logits = model.run_with_hooks(tokens, fwd_hooks=(a + b).fwd_hooks(model))

    with model.hooks(fwd_hooks=(a + b).fwd_hooks(model)):
        logits = model(tokens)

and :func:`mechlingo.analyses.evaluate.greedy_generate` / ``evaluate_facts`` take ``intervention=``.

Kinds:

* :class:`SteeringVector` -- add ``alpha * v`` to a site (default ``resid_pre``) at a layer.
* :class:`NeuronClamp` -- set / scale / add / zero chosen MLP neurons (``mlp_post``) of one
  or several layers.
* :class:`Ablation` -- replace a site's activation by zero or by a mean.
* :class:`Gated` (also ``iv.only_for(langs)``) -- an intervention applied only to prompts
  whose language is in a set (declared or identified from the text), after CAST.
* :class:`Compose` (also ``a + b``) -- several interventions as one. **Order**: hooks are
  returned in list order, and TransformerLens runs hooks registered at the same hook point
  in registration order, so in ``a + b`` the hook of ``a`` sees the clean activation and the
  hook of ``b`` sees ``a``'s result.

Positions (where along the sequence an intervention acts) follow
:func:`mechlingo.core.tokens.position_mask`: ``"last"`` (each row's last *prompt* token; padding-
and BOS-safe inside mechlingo runs, which set the current batch; a plain tensor run is taken to
be unpadded), ``"all"``, ``"last+generated"``, ``"generated"``, integer positions, or a
callable ``f(batch) -> mask``.

Each intervention says *what* it does; ``layer``, ``site`` and ``positions`` say *where*.
Add them with ``+`` (:class:`Compose`), apply them with :func:`intervene` or through
``model.hooks(iv.fwd_hooks(model))``, save and reload them with :meth:`Intervention.save` /
:func:`load_intervention` (checked against the model they were built for).

Outside TransformerLens: ``iv.attach(hf_model)`` applies any intervention to a plain
transformers model with PyTorch hooks (:mod:`~.hf`), and :func:`~.export.export` writes
steering vectors for steering-vectors, repeng and llama.cpp (:mod:`~.export`,
``docs/interop.md``).

Modules: :mod:`~.base` (the interface, saving and loading), :mod:`~.steering`,
:mod:`~.clamp`, :mod:`~.ablation`, :mod:`~.compose`, :mod:`~.gate`, :mod:`~.apply`,
:mod:`~.hf`, :mod:`~.export`.
"""

from mechlingo.core.describe import check_model, model_info, model_info_name
from mechlingo.core.errors import InterventionError, ModelMismatchError
from mechlingo.interventions.ablation import Ablation
from mechlingo.interventions.apply import intervene
from mechlingo.interventions.base import FORMAT_VERSION, Intervention, load_intervention
from mechlingo.interventions.clamp import NeuronClamp
from mechlingo.interventions.compose import Compose
from mechlingo.interventions.export import VectorExport, export, read_export
from mechlingo.interventions.gate import Gated
from mechlingo.interventions.hf import HFHandle, attach
from mechlingo.interventions.steering import SteeringVector, random_like

__all__ = [
    "FORMAT_VERSION",
    "Ablation",
    "Compose",
    "Gated",
    "HFHandle",
    "Intervention",
    "InterventionError",
    "ModelMismatchError",
    "NeuronClamp",
    "SteeringVector",
    "VectorExport",
    "attach",
    "check_model",
    "export",
    "intervene",
    "load_intervention",
    "model_info",
    "model_info_name",
    "random_like",
    "read_export",
]

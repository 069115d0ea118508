"""Interventions as composable hook objects: steering vectors, neuron clamps, ablations.

An intervention is an artifact: you build it once (by hand or with :mod:`mechlingo.analyses.recall.steering`),
save it, load it, and apply it to any run of a model it fits.

**Applying one.** :func:`intervene` is the way::

    b = mechlingo.core.tokens.encode(model, prompts)
    with mechlingo.intervene(model, task + diff, batch=b):
        logits = model(b.tokens, attention_mask=b.attention_mask())

and the analyses (``evaluate_facts``, ``greedy_generate``, ...) take ``intervention=`` and
apply it the same way. Two escape hatches:

* ``iv.fwd_hooks_for(model, batch)`` gives the TransformerLens ``(hook_name, fn)`` pairs
  for a raw ``model.run_with_hooks(..., fwd_hooks=...)`` (``iv.fwd_hooks(model)`` for one
  unpadded row);
* ``iv.attach(hf_model)`` applies it to a plain transformers model with PyTorch hooks
  (:mod:`~.hf`).

Every intervention checks itself against the model (site, layer, vector size, the model it
was saved for) before a hook is attached.

**Where and what.** Each kind says *what* it does to the activation; :class:`SiteEdit` holds
*where* (``site``, ``layer``/``layers``, ``positions``), the model check and the saved
where, so a kind implements only its edit. Kinds:

* :class:`SteeringVector` -- add ``alpha * v`` to a site (default ``resid_pre``) at a layer.
* :class:`NeuronClamp` -- set / scale / add to chosen MLP neurons (``mlp_post``) of one or
  several layers.
* :class:`Ablation` -- replace a site's activation by zero or by a mean. The one owner of
  zeroing: a clamp has no zero mode (``NeuronClamp(neurons, 0.0)`` sets chosen neurons to 0).
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

Save and reload with :meth:`Intervention.save` / :func:`load_intervention` (checked against
the model they were built for). Type an optional intervention as ``Intervention | None``.
:func:`~.export.export` writes steering vectors for steering-vectors, repeng and llama.cpp
(``docs/interop.md``).

Modules: :mod:`~.base` (the interface, the where, saving and loading), :mod:`~.steering`,
:mod:`~.clamp`, :mod:`~.ablation`, :mod:`~.gate` (the rows a language gate passes), :mod:`~.apply`
(:func:`intervene`, :func:`intervention_hooks`, :func:`first_edit`: the first position an
intervention edits), :mod:`~.hf`, :mod:`~.export`.
"""

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
from mechlingo.interventions.clamp import NeuronClamp
from mechlingo.interventions.export import VectorExport, export, read_export
from mechlingo.interventions.hf import HFHandle
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

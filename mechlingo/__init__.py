"""mechlingo: mechanistic interpretability of multilingual language models on TransformerLens.

Start with :func:`load_model` (the embedded default is google/gemma-3-270m), bundled facts
from :mod:`mechlingo.data`, and :func:`lens_facts` for the per-language logit lens.

The package is built in tiers; each folder imports only from those before it
(``scripts/check_layers.py --order``; ``docs/architecture.md`` says why each sits where it does):

    core -> kernels -> data -> viz -> activations -> interventions -> scoring -> analyses ->
    card -> report -> __main__ | cli -> __init__ | testing
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from mechlingo.core.version import __version__

if TYPE_CHECKING:  # what the lazy names are, for type checkers
    from mechlingo.analyses.circuits import CircuitResult, find_circuit
    from mechlingo.analyses.decoders.lens import LensResult, lens_facts, logit_lens
    from mechlingo.card.replicate import replicate
    from mechlingo.card.rules import ClaimsCard
    from mechlingo.core.models import DEFAULT_MODEL, load_model
    from mechlingo.core.sites import hook_name, resolve_site
    from mechlingo.core.tokens import use_chat
    from mechlingo.data import load_facts
    from mechlingo.interventions import intervene
    from mechlingo.scoring.evaluate import EvalResult, evaluate_facts, greedy_generate
    from mechlingo.testing import tiny_model

__all__ = [
    "CircuitResult",
    "ClaimsCard",
    "DEFAULT_MODEL",
    "EvalResult",
    "LensResult",
    "__version__",
    "evaluate_facts",
    "find_circuit",
    "greedy_generate",
    "hook_name",
    "intervene",
    "lens_facts",
    "load_facts",
    "load_model",
    "logit_lens",
    "replicate",
    "resolve_site",
    "tiny_model",
    "use_chat",
]

# Every name loads on first use (PEP 562), so that ``import mechlingo`` stays light (no torch:
# the ``mechlingo`` command installs its Ctrl-C handling before torch loads, see
# ``mechlingo/__main__.py``): the first ``mechlingo.lens_facts`` calls the loader of its
# module, one plain ``from ... import``, and keeps the name. Why plain imports in functions and not ``importlib.import_module`` with
# a module path: a path in a string is a dependency no reader and no checker sees, so it can
# hide an upward import or a cycle; an import statement is read by ``scripts/check_layers.py``
# like any other (the layers and cycles are checked), and this module is the one place whose
# functions may import mechlingo modules (the script's ``LAZY_LOADER``): the package is the
# top layer, so a deferred import here can never point upward.


def _evaluate() -> ModuleType:
    from mechlingo.scoring import evaluate

    return evaluate


def _lens() -> ModuleType:
    from mechlingo.analyses.decoders import lens

    return lens


def _circuits() -> ModuleType:
    import mechlingo.analyses.circuits

    return mechlingo.analyses.circuits


def _rules() -> ModuleType:
    from mechlingo.card import rules

    return rules


def _replicate() -> ModuleType:
    from mechlingo.card import replicate

    return replicate


def _models() -> ModuleType:
    from mechlingo.core import models

    return models


def _sites() -> ModuleType:
    from mechlingo.core import sites

    return sites


def _tokens() -> ModuleType:
    from mechlingo.core import tokens

    return tokens


def _data() -> ModuleType:
    import mechlingo.data

    return mechlingo.data


def _interventions() -> ModuleType:
    import mechlingo.interventions

    return mechlingo.interventions


def _testing() -> ModuleType:
    from mechlingo import testing

    return testing


_LAZY: dict[str, Callable[[], ModuleType]] = {
    "DEFAULT_MODEL": _models,
    "load_model": _models,
    "hook_name": _sites,
    "resolve_site": _sites,
    "use_chat": _tokens,
    "load_facts": _data,
    "intervene": _interventions,
    "tiny_model": _testing,
    "EvalResult": _evaluate,
    "evaluate_facts": _evaluate,
    "greedy_generate": _evaluate,
    "LensResult": _lens,
    "lens_facts": _lens,
    "logit_lens": _lens,
    "ClaimsCard": _rules,
    "CircuitResult": _circuits,
    "find_circuit": _circuits,
    "replicate": _replicate,
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(_LAZY[name](), name)
        globals()[name] = value  # resolved once; later lookups are plain attributes
        return value
    raise AttributeError(f"module 'mechlingo' has no attribute {name!r}")

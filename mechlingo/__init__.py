"""mechlingo: mechanistic interpretability of multilingual language models on TransformerLens.

Start with :func:`load_model` (the embedded default is google/gemma-3-270m), :func:`load_facts`
for bundled facts, and :func:`lens_facts` for the per-language logit lens. Every name a notebook
or the README uses is a top-level name (``from mechlingo import trace_recall``); each loads its
module on first use, so ``import mechlingo`` itself loads no torch.

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
    from mechlingo.analyses.experts import find_experts
    from mechlingo.analyses.experts.align import compare_alignment
    from mechlingo.analyses.recall.dev_grid import choose_on_dev
    from mechlingo.analyses.recall.patching import (
        attention_knockout,
        fact_readouts,
        patch_activations,
    )
    from mechlingo.analyses.recall.settings import DevGrid, ScoringOptions
    from mechlingo.analyses.recall.steering import build_steering_vectors, score_at_config
    from mechlingo.analyses.recall.trace import trace_recall
    from mechlingo.analyses.recall.trace_patching import corrupted_pairs, pipeline_phases
    from mechlingo.card.replicate import CardData, CardOptions, replicate
    from mechlingo.card.rules import ClaimsCard
    from mechlingo.core.models import DEFAULT_MODEL, ensure_default_model, load_model
    from mechlingo.core.sites import hook_name, resolve_site
    from mechlingo.core.tokens import encode, use_chat
    from mechlingo.data import (
        Fact,
        fact_from_cloze,
        few_shot_prompt,
        load_benchmark,
        load_facts,
        parallel_sentences,
        translation_prompt,
        write_jsonl,
    )
    from mechlingo.data.splits import split_facts, take_per_lang
    from mechlingo.interventions import (
        Ablation,
        Gated,
        NeuronClamp,
        SteeringVector,
        export,
        intervene,
        load_intervention,
        read_export,
    )
    from mechlingo.scoring.evaluate import (
        DecodeOptions,
        EvalResult,
        evaluate_conditions,
        evaluate_facts,
        greedy_generate,
    )
    from mechlingo.testing import tiny_model

__all__ = [
    "Ablation",
    "CardData",
    "CardOptions",
    "CircuitResult",
    "ClaimsCard",
    "DEFAULT_MODEL",
    "DecodeOptions",
    "DevGrid",
    "EvalResult",
    "Fact",
    "Gated",
    "LensResult",
    "NeuronClamp",
    "ScoringOptions",
    "SteeringVector",
    "__version__",
    "attention_knockout",
    "build_steering_vectors",
    "choose_on_dev",
    "compare_alignment",
    "corrupted_pairs",
    "encode",
    "ensure_default_model",
    "evaluate_conditions",
    "evaluate_facts",
    "export",
    "fact_from_cloze",
    "fact_readouts",
    "few_shot_prompt",
    "find_circuit",
    "find_experts",
    "greedy_generate",
    "hook_name",
    "intervene",
    "lens_facts",
    "load_benchmark",
    "load_facts",
    "load_intervention",
    "load_model",
    "logit_lens",
    "parallel_sentences",
    "patch_activations",
    "pipeline_phases",
    "read_export",
    "replicate",
    "resolve_site",
    "score_at_config",
    "split_facts",
    "take_per_lang",
    "tiny_model",
    "trace_recall",
    "translation_prompt",
    "use_chat",
    "write_jsonl",
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


def _circuits() -> ModuleType:
    import mechlingo.analyses.circuits

    return mechlingo.analyses.circuits


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


def _splits() -> ModuleType:
    from mechlingo.data import splits

    return splits


def _interventions() -> ModuleType:
    import mechlingo.interventions

    return mechlingo.interventions


def _evaluate() -> ModuleType:
    from mechlingo.scoring import evaluate

    return evaluate


def _lens() -> ModuleType:
    from mechlingo.analyses.decoders import lens

    return lens


def _patching() -> ModuleType:
    import mechlingo.analyses.recall.patching

    return mechlingo.analyses.recall.patching


def _trace() -> ModuleType:
    from mechlingo.analyses.recall import trace

    return trace


def _trace_patching() -> ModuleType:
    from mechlingo.analyses.recall import trace_patching

    return trace_patching


def _settings() -> ModuleType:
    from mechlingo.analyses.recall import settings

    return settings


def _steering() -> ModuleType:
    from mechlingo.analyses.recall import steering

    return steering


def _dev_grid() -> ModuleType:
    from mechlingo.analyses.recall import dev_grid

    return dev_grid


def _experts() -> ModuleType:
    import mechlingo.analyses.experts

    return mechlingo.analyses.experts


def _align() -> ModuleType:
    from mechlingo.analyses.experts import align

    return align


def _rules() -> ModuleType:
    from mechlingo.card import rules

    return rules


def _replicate() -> ModuleType:
    from mechlingo.card import replicate

    return replicate


def _testing() -> ModuleType:
    from mechlingo import testing

    return testing


_LAZY: dict[str, Callable[[], ModuleType]] = {
    "DEFAULT_MODEL": _models,
    "ensure_default_model": _models,
    "load_model": _models,
    "hook_name": _sites,
    "resolve_site": _sites,
    "encode": _tokens,
    "use_chat": _tokens,
    "Fact": _data,
    "fact_from_cloze": _data,
    "few_shot_prompt": _data,
    "load_benchmark": _data,
    "load_facts": _data,
    "parallel_sentences": _data,
    "translation_prompt": _data,
    "write_jsonl": _data,
    "split_facts": _splits,
    "take_per_lang": _splits,
    "Ablation": _interventions,
    "Gated": _interventions,
    "NeuronClamp": _interventions,
    "SteeringVector": _interventions,
    "export": _interventions,
    "intervene": _interventions,
    "load_intervention": _interventions,
    "read_export": _interventions,
    "EvalResult": _evaluate,
    "evaluate_conditions": _evaluate,
    "DecodeOptions": _evaluate,
    "evaluate_facts": _evaluate,
    "greedy_generate": _evaluate,
    "LensResult": _lens,
    "lens_facts": _lens,
    "logit_lens": _lens,
    "attention_knockout": _patching,
    "fact_readouts": _patching,
    "patch_activations": _patching,
    "corrupted_pairs": _trace_patching,
    "pipeline_phases": _trace_patching,
    "trace_recall": _trace,
    "DevGrid": _settings,
    "ScoringOptions": _settings,
    "build_steering_vectors": _steering,
    "score_at_config": _steering,
    "choose_on_dev": _dev_grid,
    "find_experts": _experts,
    "compare_alignment": _align,
    "ClaimsCard": _rules,
    "CardData": _replicate,
    "CardOptions": _replicate,
    "CircuitResult": _circuits,
    "find_circuit": _circuits,
    "replicate": _replicate,
    "tiny_model": _testing,
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(_LAZY[name](), name)
        globals()[name] = value  # resolved once; later lookups are plain attributes
        return value
    raise AttributeError(f"module 'mechlingo' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The top-level names, loaded or not (tab completion in a notebook lists them all)."""
    return sorted(set(globals()) | set(__all__))

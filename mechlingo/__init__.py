"""mechlingo: mechanistic interpretability of multilingual language models on TransformerLens.

Start with :func:`load_model` (the embedded default is google/gemma-3-270m), bundled facts
from :mod:`mechlingo.data`, and :func:`lens_facts` for the per-language logit lens.

The package is built in tiers; each folder imports only from those before it in this list:
``core`` (model, sites, tokens, errors) -> ``kernels`` (readout, ranking, statistics) |
``data`` -> ``viz`` (figures from plain data) -> ``activations`` (runs, pooled statistics,
decoding) -> ``interventions`` -> ``analyses`` (the methods) -> ``report`` (HTML pages) ->
``cli``.
"""

from __future__ import annotations

import importlib
from typing import Any

from mechlingo.core.chat import use_chat
from mechlingo.core.models import DEFAULT_MODEL, load_model
from mechlingo.core.sites import hook_name, resolve_site
from mechlingo.core.version import __version__
from mechlingo.data import load_facts
from mechlingo.interventions import intervene
from mechlingo.testing import tiny_model

__all__ = [
    "ClaimsCard",
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
    "replicate",
    "resolve_site",
    "tiny_model",
    "use_chat",
]

# The analyses load on first use (PEP 562), so that ``import mechlingo`` stays light.
_LAZY = {
    "EvalResult": "mechlingo.analyses.scoring.evaluate",
    "evaluate_facts": "mechlingo.analyses.scoring.evaluate",
    "greedy_generate": "mechlingo.analyses.scoring.evaluate",
    "LensResult": "mechlingo.analyses.decoders.lens",
    "lens_facts": "mechlingo.analyses.decoders.lens",
    "logit_lens": "mechlingo.analyses.decoders.lens",
    "ClaimsCard": "mechlingo.card.rules",
    "replicate": "mechlingo.card.replicate",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # resolved once; later lookups are plain attributes
        return value
    raise AttributeError(f"module 'mechlingo' has no attribute {name!r}")

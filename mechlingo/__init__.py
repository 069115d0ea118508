"""mechlingo: mechanistic interpretability of multilingual language models on TransformerLens.

Start with :func:`load_model` (the embedded default is google/gemma-3-270m), bundled facts
from :mod:`mechlingo.data`, and :func:`lens_facts` for the per-language logit lens.
"""

from __future__ import annotations

__version__ = "0.1.0"

from mechlingo.interventions import intervene as intervene  # noqa: E402
from mechlingo.models import DEFAULT_MODEL, load_model, tiny_model  # noqa: E402
from mechlingo.sites import hook_name, resolve_site  # noqa: E402

__all__ = ["DEFAULT_MODEL", "__version__", "hook_name", "load_model", "resolve_site", "tiny_model"]


def __getattr__(name: str):  # lazy imports keep `import mechlingo` light
    if name in ("logit_lens", "lens_facts", "LensResult"):
        from mechlingo import lens

        return getattr(lens, name)
    if name in ("evaluate_facts", "greedy_generate", "EvalResult"):
        from mechlingo import evaluate

        return getattr(evaluate, name)
    if name in ("load_facts",):
        from mechlingo import data

        return getattr(data, name)
    raise AttributeError(f"module 'mechlingo' has no attribute {name!r}")

"""How ``mechlingo trace`` runs, as one frozen options object.

:class:`TraceOptions` holds the settings of
:func:`~mechlingo.analyses.recall.trace.run_trace` (``run_trace(model, facts, options)``; its
defaults are these), checked when it is made; the command builds it from its flags.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mechlingo.core.defaults import BATCH_SIZE, CIRCUIT_PROMPTS, MAX_NEW_TOKENS, PROGRESS
from mechlingo.core.errors import InputError

__all__ = ["TRACE_METHODS", "TraceOptions"]

#: how the patching is done: exact patching, attribution patching or both
TRACE_METHODS = ("exact", "atp", "both")


@dataclass(frozen=True)
class TraceOptions:
    """The settings of one recall trace (their meaning:
    :func:`~mechlingo.analyses.recall.trace.run_trace`).

    Attributes:
        max_rank: the rank at or below which an answer is decodable at a lens entry.
        mid_layers: the "mid-network" lens entries (``None``: the default middle third).
        max_new_tokens, batch_size, progress: as in every scoring call.
        patch_prompts: prompts per language patched (0 skips patching and knockout).
        patch_sites: the sites patched. cells_per_batch: patched copies per pass.
        method: one of :data:`TRACE_METHODS`. verify_heads: heads verified exactly.
        unanswered: patch prompts the model did not answer correctly too (and score the
            measured circuit on them).
        circuit_prompts: correctly answered prompts per language the measured circuit's
            edges are scored on (EAP-IG; 0 skips the measured circuit).
    """

    max_rank: int = 10
    mid_layers: tuple[int, ...] | None = None
    max_new_tokens: int = MAX_NEW_TOKENS
    batch_size: int = BATCH_SIZE
    patch_prompts: int = 3
    patch_sites: tuple[str, ...] = ("attn_out", "mlp_out")
    cells_per_batch: int | None = None
    method: str = "exact"
    verify_heads: int = 5
    progress: bool = PROGRESS
    unanswered: bool = False
    circuit_prompts: int = CIRCUIT_PROMPTS

    def __post_init__(self) -> None:
        low = {"max_rank": 0, "max_new_tokens": 1, "batch_size": 1, "patch_prompts": 0,
               "verify_heads": 0, "circuit_prompts": 0}  # fmt: skip
        for name, least in low.items():
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                flag = "--" + name.replace("_", "-")
                raise InputError(
                    f"{name} ({flag}) must be an integer of at least {least}, got {v!r}"
                )
        if self.cells_per_batch is not None and self.cells_per_batch < 1:
            raise InputError(f"cells_per_batch (--cells-per-batch) must be at least 1, got "
                             f"{self.cells_per_batch}")  # fmt: skip
        if self.method not in TRACE_METHODS:
            raise InputError(f"method {self.method!r}: pass one of {', '.join(TRACE_METHODS)}")
        if not self.patch_sites and self.patch_prompts:
            raise InputError("patch_sites is empty: pass at least one site (--patch-sites)")

    def kw(self) -> dict[str, Any]:
        """The settings as a dict (their names are the fields)."""
        return asdict(self)

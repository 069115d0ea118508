"""Attention knockout (Geva et al. 2023).

:func:`attention_knockout` blocks the attention edges from the last token to the subject
tokens in a window of layers (the pre-softmax scores ``blocks.{l}.attn.hook_attn_scores`` are
set to ``-inf`` for all heads, so each row's softmax renormalises over the remaining keys, as
in the paper) and measures the drop in the answer's probability, per window; the windows are
batched like the cells of a patching grid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mechlingo.analyses.recall.patching.errors import PatchingError
from mechlingo.analyses.recall.patching.positions import Spans, as_batch, check_spans
from mechlingo.analyses.recall.patching.readouts import (
    AnswerReadout,
    PackedReadouts,
    answer_logprob,
    evaluate_readouts,
    pack_readouts,
)
from mechlingo.analyses.recall.patching.result import bootstrap_interval
from mechlingo.analyses.recall.patching.runs import read_run, repeat_batch
from mechlingo.core.defaults import SEED
from mechlingo.core.sites import site_map
from mechlingo.core.tokens import TokenBatch
from mechlingo.core.types import Model
from mechlingo.viz.common import html_summary, interval_text
from mechlingo.viz.patching import knockout_figure

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = ["KnockoutResult", "attention_knockout", "sliding_windows"]


@dataclass
class KnockoutResult:
    """The result of :func:`attention_knockout`.

    Attributes:
        windows: ``(first, last)`` inclusive layer windows whose last-token -> key attention
            was blocked.
        readout_name: name of the readout (a probability by default).
        values: ``[window, example]`` readout with the edges blocked.
        base: ``[example]`` readout of the unmodified run.
        keys: which key positions were blocked (``"subject"``, ``"last"``, ...).
    """

    windows: list[tuple[int, int]]
    readout_name: str
    values: Float[Tensor, "window example"]
    base: Float[Tensor, " example"]
    keys: str
    meta: dict[str, Any] = field(default_factory=dict)

    def relative_change(self) -> Float[Tensor, " window"]:
        """``(blocked - base) / base`` of the mean over examples (−0.4 = a 40% drop)."""
        b = self.base.mean()
        return (self.values.mean(-1) - b) / b

    def bootstrap_ci(
        self, *, n_boot: int = 1000, seed: int = SEED, level: float = 0.95
    ) -> tuple[Float[Tensor, " window"], Float[Tensor, " window"]]:
        """Bootstrap interval of :meth:`relative_change` (resampling examples)."""

        def stat(idx: Tensor) -> Tensor:  # [window, boot]
            b = self.base[idx].mean(-1)
            return (self.values[:, idx].mean(-1) - b) / b

        n = self.values.shape[-1]
        return bootstrap_interval(stat, n, n_boot=n_boot, seed=seed, level=level)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per window: blocked and base means, relative change and its interval."""
        import pandas as pd

        rel = self.relative_change()
        lo, hi = self.bootstrap_ci()
        return pd.DataFrame(
            [
                {
                    "first_layer": a,
                    "last_layer": b,
                    "keys": self.keys,
                    "readout": self.readout_name,
                    "blocked_mean": float(self.values[i].mean()),
                    "base_mean": float(self.base.mean()),
                    "relative_change": float(rel[i]),
                    "ci_low": float(lo[i]),
                    "ci_high": float(hi[i]),
                }
                for i, (a, b) in enumerate(self.windows)
            ]
        )

    def __repr__(self) -> str:
        return (
            f"KnockoutResult(last token -> {self.keys}, {len(self.windows)} layer windows, "
            f"{self.values.shape[-1]} examples, readout {self.readout_name})"
        )

    def _repr_html_(self) -> str:
        """Per layer window the relative change of the readout with its 95% interval."""
        rel = self.relative_change()
        lo, hi = self.bootstrap_ci()
        n = int(self.values.shape[-1])
        rows = [{"layers": f"{a}-{b}",
                 "relative change [95% CI]": interval_text(float(rel[i]), float(lo[i]),
                                                           float(hi[i])), "n": n}
                for i, (a, b) in enumerate(self.windows)]  # fmt: skip
        return html_summary(repr(self), rows, f"base mean {float(self.base.mean()):.3g}")

    def fig_knockout(self) -> go.Figure:
        """Relative change of the readout per layer window (with the 95% interval)."""
        lo, hi = self.bootstrap_ci()
        return knockout_figure(
            self.relative_change(),
            lo,
            hi,
            windows=self.windows,
            keys=self.keys,
            readout_name=self.readout_name,
            n_examples=int(self.values.shape[-1]),
        )


def sliding_windows(n_layers: int, size: int) -> list[tuple[int, int]]:
    """Windows ``(l, min(l + size, n) - 1)`` centred nowhere: one starting at every layer."""
    if size < 1:
        raise PatchingError("window size must be >= 1")
    return [(start, min(start + size, n_layers) - 1) for start in range(n_layers)]


def _resolve_windows(
    n: int, windows: Sequence[tuple[int, int]] | int | None
) -> list[tuple[int, int]]:
    if windows is None:
        windows = max(1, n // 6)
    if isinstance(windows, int):
        windows = sliding_windows(n, windows)
    windows = [(int(a), int(b)) for a, b in windows]
    for a, b in windows:
        if not (0 <= a < n and -1 <= b < n and b >= a - 1):
            raise PatchingError(f"layer window {(a, b)} is out of range for {n} layers")
    return windows


def _key_mask(batch: TokenBatch, keys: str, spans: Spans) -> Bool[Tensor, "row pos"]:
    """Which key positions of each row are blocked."""
    key_mask = torch.zeros(batch.tokens.shape, dtype=torch.bool)
    if keys == "subject":
        if spans is None:
            raise PatchingError("keys='subject' needs Facts or subject=[(first, last)] spans")
        for i, (a, b) in enumerate(spans):
            key_mask[i, a : b + 1] = True
    elif keys == "last":
        key_mask[torch.arange(batch.batch_size), batch.last_index.cpu()] = True
    else:
        raise PatchingError(f"unknown keys {keys!r}; use 'subject' or 'last'")
    return key_mask


def _blocker(rows: Tensor, query: Tensor, key_mask: Tensor) -> Callable:
    """Set scores ``[row, :, query[row], key]`` to ``-inf`` where ``key_mask[row, key]``."""

    def hook(t: Tensor, hook: Any) -> Tensor:
        r, q, km = rows.to(t.device), query.to(t.device), key_mask.to(t.device)
        t = t.clone()
        sub = t[r, :, q]  # [n, head, key]
        blocked = km[:, None, : sub.shape[-1]].expand_as(sub)
        t[r, :, q] = sub.masked_fill(blocked, float("-inf"))
        return t

    return hook


def _window_hooks(
    model: Model, chunk: Sequence[tuple[int, int]], big: TokenBatch, key_mask: Tensor
) -> list[tuple[str, Callable]]:
    """Blocking hooks for ``big`` (one copy of the batch per window of ``chunk``): at each
    layer, the copies whose window holds that layer are blocked."""
    B = key_mask.shape[0]
    last = big.last_index.cpu()
    km = key_mask.repeat(len(chunk), 1)
    fwd_hooks = []
    for layer in range(site_map(model).n_layers):
        copies = [j for j, (a, b) in enumerate(chunk) if a <= layer <= b]
        if not copies:
            continue
        sel = torch.zeros(len(chunk) * B, dtype=torch.bool)
        for j in copies:
            sel[j * B : (j + 1) * B] = True
        r = sel.nonzero()[:, 0]
        fwd_hooks.append((f"blocks.{layer}.attn.hook_attn_scores", _blocker(r, last[r], km[r])))
    missing = [h for h, _ in fwd_hooks if h not in model.hook_dict]
    if missing:
        raise PatchingError(f"this model has no attention-score hooks {missing[:2]}")
    return fwd_hooks


def _knockout_readout(model: Model, facts: Any, readout: AnswerReadout | None) -> AnswerReadout:
    if readout is not None:
        return readout
    if not (isinstance(facts, Sequence) and facts and hasattr(facts[0], "answer")):
        raise PatchingError("pass readout= when the inputs are not Facts")
    answers, langs = [f.answer for f in facts], [f.lang for f in facts]
    return answer_logprob(model, answers, langs, name="answer_prob", prob=True)


def attention_knockout(
    model: Model,
    facts: Any,
    windows: Sequence[tuple[int, int]] | int | None = None,
    *,
    readout: AnswerReadout | None = None,
    keys: str = "subject",
    subject: Sequence[tuple[int, int]] | None = None,
    windows_per_batch: int = 16,
) -> KnockoutResult:
    """Block attention from each prompt's last token to key positions in windows of layers.

    Args:
        model: a TransformerLens model with ``attn.hook_attn_scores``.
        facts: Facts (their subject spans are used), or prompts / a TokenBatch with
            ``subject`` token spans.
        windows: inclusive ``(first, last)`` layer windows, an int window size (one window
            starting at every layer), or ``None`` (size ``max(1, n_layers // 6)``). An empty
            window ``(l, l - 1)`` blocks nothing.
        readout: what each run is read out as (default the probability of each fact's
            answer set).
        keys: ``"subject"`` (the subject tokens) or ``"last"`` (the last token itself).

    Returns:
        A :class:`KnockoutResult`; windows are batched ``windows_per_batch`` at a time.
    """
    batch, spans = as_batch(model, facts, "knockout")
    spans = check_spans(subject, batch, "knockout") or spans
    windows = _resolve_windows(site_map(model).n_layers, windows)
    key_mask = _key_mask(batch, keys, spans)
    readout = _knockout_readout(model, facts, readout)
    packed: PackedReadouts = pack_readouts([readout], batch.batch_size)
    B = batch.batch_size
    rows = torch.arange(B)
    _, final = read_run(model, batch, {})
    base = evaluate_readouts(model, final, [readout], packed, rows)[0].cpu()
    values = torch.empty(len(windows), B)
    for start in range(0, len(windows), windows_per_batch):
        chunk = windows[start : start + windows_per_batch]
        big = repeat_batch(batch, len(chunk))
        fwd_hooks = _window_hooks(model, chunk, big, key_mask)
        _, final = read_run(model, big, {}, fwd_hooks=fwd_hooks)
        v = evaluate_readouts(model, final, [readout], packed, rows.repeat(len(chunk)))[0]
        values[start : start + len(chunk)] = v.reshape(len(chunk), B).cpu()
    return KnockoutResult(windows, readout.name, values, base, keys)

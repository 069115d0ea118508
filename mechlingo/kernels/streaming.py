"""Streaming accumulators and pooling: statistics whose memory does not grow with the number
of samples, mergeable across batches and processes.

* :class:`ActivationProbability` -- per language, the fraction of real tokens on which each
  feature's activation is > 0 (the input of :func:`mechlingo.kernels.ranking.lape`).
* :func:`masked_pool` -- mean / max over real (non-padding) positions.
* :class:`StreamingMean` -- memory independent of the number of samples, mergeable, with a
  tensor-only ``state_dict`` (ready for ``torch.distributed.all_reduce``).
* :func:`mean_difference` -- difference of two :class:`StreamingMean` accumulators.

Streaming means keep plain float64 running sums (not Welford/Kahan): float64 has ~16
significant digits, so even 1e9 float32 activations sum with a relative error far below
float32 resolution, and plain sums merge across processes by simple addition. Everything runs
on the inputs' device; nothing calls ``.item()`` on a hot path.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mechlingo.core.errors import InputError

__all__ = [
    "ActivationProbability",
    "StreamingMean",
    "masked_pool",
    "mean_difference",
]


_State = tuple[Tensor | None, Tensor | None]


def _merged(mine: _State, theirs: _State) -> _State:
    """Two accumulators' ``(values, counts)`` states added up: ``theirs`` added into ``mine``
    in place; ``mine`` unchanged when ``theirs`` is empty (``None`` in it), a copy of
    ``theirs`` when ``mine`` is.

    Raises:
        InputError: the values have different shapes.
    """
    (a, n), (b, m) = mine, theirs
    if b is None or m is None:
        return mine
    if a is None or n is None:
        return b.clone(), m.clone()
    if b.shape != a.shape:
        raise InputError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    a += b.to(a.device)
    n += m.to(n.device)
    return a, n


class ActivationProbability:
    """Streaming per-language activation probability: the fraction of real (non-padding)
    tokens of each language on which each feature's activation exceeds ``threshold`` (0 by
    default, i.e. "fires").

    Memory is [n_langs, n_features] int64 counts, independent of the number of tokens. Feed
    :attr:`prob_active` to :func:`mechlingo.kernels.ranking.lape`.

    Example::

        acc = ActivationProbability(n_langs=len(langs))
        for acts, mask, lang_ids in batches:      # acts [batch, pos, d_mlp]
            acc.update(acts, lang=lang_ids, mask=mask)
        scores = lape(acc.prob_active)
    """

    def __init__(self, n_langs: int, threshold: float = 0.0) -> None:
        if n_langs < 1:
            raise InputError(f"n_langs must be >= 1, got {n_langs}")
        self.n_langs = n_langs
        self.threshold = threshold
        self.active: Int[Tensor, "n_langs n_features"] | None = None
        self.tokens: Int[Tensor, " n_langs"] | None = None

    def update(
        self,
        acts: Float[Tensor, "*tokens n_features"],
        lang: int | Int[Tensor, "*lead"],
        mask: Bool[Tensor, "*tokens"] | None = None,
    ) -> None:
        """Count one batch.

        Args:
            acts: activations with the feature axis last, e.g. [batch, pos, d_mlp].
            lang: a language index for the whole batch, or a tensor of language indices whose
                shape is a prefix of ``acts.shape[:-1]`` (e.g. [batch], one per sentence).
            mask: True at real tokens, shape ``acts.shape[:-1]``; padding is not counted.
        """
        lead = acts.shape[:-1]
        d = acts.shape[-1]
        if mask is not None and tuple(mask.shape) != tuple(lead):
            raise InputError(
                f"mask must have shape acts.shape[:-1] = {tuple(lead)}, got {tuple(mask.shape)}"
            )
        if self.active is None:
            self.active = torch.zeros(self.n_langs, d, dtype=torch.int64, device=acts.device)
            self.tokens = torch.zeros(self.n_langs, dtype=torch.int64, device=acts.device)
        elif self.active.shape[1] != d:
            raise InputError(
                f"acts have {d} features but this accumulator holds {self.active.shape[1]}"
            )
        assert self.tokens is not None
        fired = acts > self.threshold
        real = (
            torch.ones(lead, dtype=torch.bool, device=acts.device)
            if mask is None
            else mask.to(device=acts.device, dtype=torch.bool)
        )
        fired &= real[..., None]
        if isinstance(lang, int):
            if not 0 <= lang < self.n_langs:
                raise InputError(f"lang {lang} out of range for n_langs={self.n_langs}")
            self.active[lang] += (
                fired.reshape(-1, d).sum(dim=0, dtype=torch.int64).to(self.active.device)
            )
            self.tokens[lang] += real.sum(dtype=torch.int64).to(self.tokens.device)
            return
        lang = lang.to(acts.device)
        if tuple(lang.shape) != tuple(lead[: lang.ndim]):
            raise InputError(
                f"lang must be an int or have a shape that is a prefix of acts.shape[:-1] = "
                f"{tuple(lead)}, got {tuple(lang.shape)}"
            )
        k = lang.ndim
        per_group = fired.reshape(*lead[:k], -1, d).sum(dim=-2, dtype=torch.int64)
        tok_group = real.reshape(*lead[:k], -1).sum(dim=-1, dtype=torch.int64)
        idx = lang.reshape(-1).to(torch.int64)
        if bool(((idx < 0) | (idx >= self.n_langs)).any()):
            raise InputError(f"lang indices must lie in [0, {self.n_langs})")
        self.active.index_add_(0, idx.to(self.active.device), per_group.reshape(-1, d))
        self.tokens.index_add_(0, idx.to(self.tokens.device), tok_group.reshape(-1))

    @property
    def prob_active(self) -> Float[Tensor, "n_langs n_features"]:
        """float64 [n_langs, n_features]: fraction of real tokens where each feature fired."""
        if self.active is None or self.tokens is None:
            raise InputError("no tokens counted yet: call update() first")
        empty = (self.tokens == 0).nonzero().flatten().tolist()
        if empty:
            raise InputError(
                f"languages {empty} have no tokens counted; feed text of every language or "
                "use a smaller n_langs"
            )
        return self.active.to(torch.float64) / self.tokens.to(torch.float64)[:, None]

    def merge(self, other: ActivationProbability) -> ActivationProbability:
        """Add another accumulator's counts into this one (in place); returns self."""
        if other.n_langs != self.n_langs:
            raise InputError(f"n_langs differ: {self.n_langs} vs {other.n_langs}")
        self.active, self.tokens = _merged((self.active, self.tokens), (other.active, other.tokens))
        return self

    def state_dict(self) -> dict[str, Tensor]:
        """``{"active": int64 [n_langs, n_features], "tokens": int64 [n_langs]}``; both are
        counts, so a SUM all-reduce of each entry across processes combines accumulators
        (the threshold is configuration, not state: pass it to :meth:`from_state`)."""
        if self.active is None or self.tokens is None:
            raise InputError("empty accumulator: call update() first")
        return {"active": self.active, "tokens": self.tokens}

    @classmethod
    def from_state(cls, state: dict[str, Tensor], threshold: float = 0.0) -> ActivationProbability:
        """Rebuild an accumulator from :meth:`state_dict` output (tensors are copied)."""
        acc = cls(int(state["active"].shape[0]), threshold)
        acc.active = state["active"].clone()
        acc.tokens = state["tokens"].clone()
        return acc


# --------------------------------------------------------------------------------------------
# pooling and streaming means
# --------------------------------------------------------------------------------------------


def masked_pool(
    acts: Float[Tensor, "batch pos d"],
    mask: Bool[Tensor, "batch pos"],
    how: Literal["mean", "max"] = "mean",
) -> Float[Tensor, "batch d"]:
    """Pool activations over the real (``mask`` True) positions of each row.

    ``"mean"``: average over real tokens (the sentence's typical activation; Kojima et al.).
    ``"max"``: largest value over real tokens (did the neuron fire strongly anywhere in the
    sentence; Suau et al.). Padding never contributes, whatever its value (even NaN/inf).
    Means of float16/bfloat16 inputs are accumulated in float32. Result dtype = ``acts.dtype``.

    Raises:
        ValueError: shape mismatch, unknown ``how``, or a row with no real position (its pool
            would be undefined).
    """
    if acts.ndim != 3 or mask.ndim != 2 or tuple(acts.shape[:2]) != tuple(mask.shape):
        raise InputError(
            f"expected acts [batch, pos, d] and mask [batch, pos]; got acts "
            f"{tuple(acts.shape)} and mask {tuple(mask.shape)}"
        )
    if how not in ("mean", "max"):
        raise InputError(f"how must be 'mean' or 'max', got {how!r}")
    mask = mask.to(device=acts.device, dtype=torch.bool)
    n_real = mask.sum(dim=1)
    empty = (n_real == 0).nonzero().flatten().tolist()
    if empty:
        raise InputError(
            f"rows {empty} of mask have no real (True) position; drop those rows or fix the "
            "attention mask"
        )
    m = mask[..., None]
    if how == "max":
        fill = -math.inf if acts.is_floating_point() else torch.iinfo(acts.dtype).min
        return torch.where(m, acts, fill).amax(dim=1)
    acc_dtype = torch.float32 if acts.dtype in (torch.float16, torch.bfloat16) else acts.dtype
    if not acc_dtype.is_floating_point:
        acc_dtype = torch.float64
    total = torch.where(m, acts, 0).sum(dim=1, dtype=acc_dtype)
    out = total / n_real[:, None].to(acc_dtype)
    return out.to(acts.dtype) if acts.is_floating_point() else out


class StreamingMean:
    """Running (optionally weighted) mean with memory independent of the number of samples.

    Keeps a float64 running sum of the feature shape and a float64 total weight on the
    device of the data. ``update`` reduces the leading axes of a batch: the first axis when
    no weight is given, else the axes covered by ``weight`` (a boolean mask excludes
    positions, e.g. padding; real-valued weights scale samples). Accumulators merge by adding
    sums and weights, so :meth:`state_dict` can be all-reduced (SUM) across processes and
    rebuilt with :meth:`from_state`.

    Example::

        m = StreamingMean()
        for acts, mask in batches:           # acts [batch, pos, d]
            m.update(acts, mask)             # mean over real tokens -> [d]
        m.mean                               # float64 [d]

    A mean difference (e.g. a steering vector, target minus source language) is
    ``mean_difference(m_target, m_source)``.
    """

    def __init__(
        self,
        shape: tuple[int, ...] | torch.Size | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        """``shape``/``device`` pre-allocate zeros (so every process holds same-shaped state
        before any update); otherwise both are taken from the first batch."""
        self._sum: Tensor | None = None
        self._count: Tensor | None = None
        if shape is not None:
            self._sum = torch.zeros(tuple(shape), dtype=torch.float64, device=device)
            self._count = torch.zeros((), dtype=torch.float64, device=device)

    def update(
        self,
        x: Float[Tensor, "*lead_and_feature"],
        weight: Bool[Tensor, "*lead"] | Float[Tensor, "*lead"] | None = None,
    ) -> None:
        """Add a batch. Without ``weight`` the first axis is the sample axis; with ``weight``
        its shape must be a prefix of ``x.shape`` and those axes are reduced."""
        if weight is None:
            if x.ndim < 1:
                raise InputError("x must have a leading sample axis")
            s = x.sum(dim=0, dtype=torch.float64)
            c: Tensor | float = float(x.shape[0])  # host scalar: no device copy per batch
        else:
            k = weight.ndim
            if tuple(weight.shape) != tuple(x.shape[:k]):
                raise InputError(
                    f"weight shape {tuple(weight.shape)} must be a prefix of x shape "
                    f"{tuple(x.shape)}"
                )
            weight = weight.to(x.device)
            w = weight.reshape(*weight.shape, *([1] * (x.ndim - k)))
            dims = tuple(range(k))
            if weight.dtype == torch.bool:
                s = torch.where(w, x, 0).sum(dim=dims, dtype=torch.float64)
                c = weight.sum(dtype=torch.float64)
            else:
                w64 = w.to(torch.float64)
                s = (x.to(torch.float64) * w64).sum(dim=dims)
                c = weight.to(torch.float64).sum()
        if self._sum is None or self._count is None:
            self._sum = s
            self._count = torch.zeros((), dtype=torch.float64, device=s.device) + c
            return
        if s.shape != self._sum.shape:
            raise InputError(
                f"batch feature shape {tuple(s.shape)} differs from the accumulated "
                f"{tuple(self._sum.shape)}"
            )
        self._sum += s.to(self._sum.device)
        self._count += c.to(self._count.device) if isinstance(c, Tensor) else c

    @property
    def count(self) -> Float[Tensor, ""]:
        """Total weight seen (the number of samples/real positions when unweighted)."""
        if self._count is None:
            return torch.zeros((), dtype=torch.float64)
        return self._count

    @property
    def sum(self) -> Float[Tensor, "*feature"]:
        """float64 running sum."""
        if self._sum is None:
            raise InputError("empty accumulator: call update() first")
        return self._sum

    @property
    def mean(self) -> Float[Tensor, "*feature"]:
        """float64 mean over everything seen so far (cast with ``.to(dtype)`` as needed)."""
        if self._sum is None or self._count is None or not bool(self._count > 0):
            raise InputError("empty accumulator (zero total weight): call update() first")
        return self._sum / self._count

    def merge(self, other: StreamingMean) -> StreamingMean:
        """Fold another accumulator into this one (in place); returns self. The result equals
        one accumulator fed both streams."""
        self._sum, self._count = _merged((self._sum, self._count), (other._sum, other._count))
        return self

    def state_dict(self) -> dict[str, Tensor]:
        """``{"sum": float64 [*feature], "count": float64 []}``; both are sums, so a SUM
        all-reduce of each entry across processes combines accumulators."""
        if self._sum is None or self._count is None:
            raise InputError(
                "empty accumulator: call update() first, or construct with shape= so every "
                "process holds same-shaped state"
            )
        return {"sum": self._sum, "count": self._count}

    @classmethod
    def from_state(cls, state: dict[str, Tensor]) -> StreamingMean:
        """Rebuild from :meth:`state_dict` output (tensors are copied)."""
        acc = cls()
        acc._sum = state["sum"].to(torch.float64).clone()
        acc._count = state["count"].to(torch.float64).clone()
        return acc


def mean_difference(a: StreamingMean, b: StreamingMean) -> Float[Tensor, "*feature"]:
    """``a.mean - b.mean`` in float64: e.g. mean activation on the target language minus the
    mean on the others (a steering direction). Both accumulators must have the same shape."""
    ma, mb = a.mean, b.mean
    if ma.shape != mb.shape:
        raise InputError(f"shapes differ: {tuple(ma.shape)} vs {tuple(mb.shape)}")
    return ma - mb.to(ma.device)

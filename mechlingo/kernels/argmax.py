"""Exact greedy argmax over a large vocabulary, screened by a bfloat16 unembedding.

The bfloat16 product ``x @ W_U`` is only a *screen*: every column whose logit could still be
the maximum (its upper error bound, :func:`error_bound`, reaches the row's best lower bound)
is kept by :func:`kept_columns` and scored again in float32, so :func:`screened_argmax` returns
the float32 arg-max (ties to the lowest index, as :func:`torch.argmax`). :func:`build_screen`
makes the bfloat16 copy of ``W_U`` and its measured rounding norms; :func:`bf16_supported`
says where the bound holds, and :func:`screen_is_faster` measures whether the screen beats
the plain float32 arg-max on this machine (a CPU that emulates bfloat16 makes it slower).
The bound and why it is rigorous: ``docs/scaling.md``; timings: ``docs/benchmarks.md``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

# Above this many kept columns (over the whole batch) the float32 recheck costs more than a
# plain product; the caller then falls back to the full float32 arg-max.
MAX_KEPT = 16384

U_BF16 = 2.0**-8  # unit round-off of bfloat16 (8 significant bits)
_MARGIN = 1.0 + 2.0**-10  # covers the float32 round-off of the norms themselves
_FLOOR = 2.0**-80  # covers products and sums flushed to zero (denormals, 2**-126 each)


def accumulation_bound(d_model: int) -> float:
    """``gamma_d = d u32 / (1 - d u32)`` with ``u32 = 2**-24``: a float32 sum of ``d_model``
    products, in any order, is within ``gamma_d * sum_i |x_i| |W_ij|`` of the exact one."""
    n = d_model * 2.0**-24
    return n / (1.0 - n)


@dataclass
class Screen:
    """The bfloat16 copy of an unembedding and the column norms of its error bound.

    Attributes:
        W_bf16: ``W_U`` transposed to ``[vocab, d_model]`` in bfloat16 (row-major, the
            layout :func:`torch.nn.functional.linear` wants).
        col_norm: float32 Euclidean norm of each column of ``W_U``.
        bf_norm: norm of each column rounded to bfloat16.
        round_norm: norm of each column's rounding error ``W_j - bW_j``.
        gamma: :func:`accumulation_bound` of ``d_model``.
    """

    W_bf16: Float[Tensor, "vocab d_model"]
    col_norm: Float[Tensor, " vocab"]
    bf_norm: Float[Tensor, " vocab"]
    round_norm: Float[Tensor, " vocab"]
    gamma: float


def build_screen(W: Float[Tensor, "d_model vocab"]) -> Screen:
    """The :class:`Screen` of an unembedding matrix (``d_model x vocab``)."""
    Wf = W.detach().float()
    Wb = Wf.T.contiguous().to(torch.bfloat16)
    back = Wb.float()
    return Screen(
        W_bf16=Wb,
        col_norm=Wf.norm(dim=0),
        bf_norm=back.norm(dim=1),
        round_norm=(Wf.T - back).norm(dim=1),
        gamma=accumulation_bound(W.shape[0]),
    )


def _row_terms(x: Float[Tensor, "row d_model"], screen: Screen) -> tuple[Tensor, Tensor, Tensor]:
    """Per row, the factors of the column norms in the slack: ``(p, q, s)`` with slack
    ``p ||W_j - bW_j|| + q ||bW_j|| + s ||W_j||`` (before the output rounding term)."""
    xf = x.float()
    bx = xf.to(torch.bfloat16).float()
    nx = xf.norm(dim=1, keepdim=True)
    p = _MARGIN * nx
    q = _MARGIN * (
        (xf - bx).norm(dim=1, keepdim=True) + screen.gamma * bx.norm(dim=1, keepdim=True)
    )
    s = _MARGIN * screen.gamma * nx
    return p, q, s


def _rel(b: Tensor | None) -> float:
    """The relative slack on ``|a_j| + |b_j|``: the bfloat16 rounding of the sum, and with a
    bias the float32 additions of it (screened and exact)."""
    return U_BF16 / (1.0 - U_BF16) + (0.0 if b is None else 2.0**-22)


def error_bound(
    x: Float[Tensor, "row d_model"],
    screen: Screen,
    approx: Float[Tensor, "row vocab"],
    b: Float[Tensor, " vocab"] | None = None,
) -> Float[Tensor, "row vocab"]:
    """The bound of the module docstring for every row and column: how far a screened logit
    ``approx`` (the bfloat16 product, plus ``b`` in float32 if given) may lie from the
    float32 logit ``x @ W + b``. Elementwise over the whole block (for tests and checks;
    :func:`kept_columns` evaluates it on the few columns that need it)."""
    cols = (screen.round_norm, screen.bf_norm, screen.col_norm)
    return _bound(_row_terms(x, screen), cols, approx, b)


def _bound(
    terms: tuple[Tensor, Tensor, Tensor],
    cols: tuple[Tensor, Tensor, Tensor],
    approx: Tensor,
    b: Tensor | None,
) -> Tensor:
    """:func:`error_bound` from the rows' factors (:func:`_row_terms`) and the columns'
    norms ``(||W_j - bW_j||, ||bW_j||, ||W_j||)`` of the block's columns."""
    (p, q, s), (rn, bn, cn) = terms, cols
    a = approx.float().abs() + (0.0 if b is None else b.float().abs())
    return p * rn + q * bn + s * cn + _rel(b) * a + _FLOOR


def kept_columns(
    x: Float[Tensor, "row d_model"], screen: Screen, b: Float[Tensor, " vocab"] | None = None
) -> Int[Tensor, " kept"]:
    """Sorted ids of the columns that may hold some row's maximum logit.

    Per row, the column with the largest approximate logit gives a lower bound ``tau`` on
    the true maximum; a column is kept when its upper bound (its logit plus
    :func:`error_bound`) reaches ``tau``. Two passes over the vocabulary: a compare against
    ``tau`` minus the largest slack any column of the row can have, then the exact
    per-column bound on the few columns that pass."""
    approx = torch.nn.functional.linear(x.to(torch.bfloat16), screen.W_bf16)
    if b is not None:
        approx = approx.float() + b.float()
    p, q, s = _row_terms(x, screen)
    rel = _rel(b)
    # ``max`` gives value and index in one pass (a bfloat16 ``argmax`` is much slower on CPU:
    # docs/benchmarks.md)
    top_val, top = approx.max(dim=1, keepdim=True)
    top_val, top = top_val.float(), top.squeeze(1)
    bmax = 0.0 if b is None else float(b.float().abs().max())
    at_top = tuple(
        c[top].unsqueeze(1) for c in (screen.round_norm, screen.bf_norm, screen.col_norm)
    )
    b_top = None if b is None else b.float()[top].unsqueeze(1)
    slack_top = _bound((p, q, s), at_top, top_val, b_top)  # type: ignore[arg-type]
    tau = top_val - slack_top  # below the row's true maximum
    # a column j that passes has a_j >= t - rel * |a_j| (t below: tau less the widest column
    # slack); so |a_j| is at most the top's when a_j >= 0, and |t| / (1 - rel) when a_j < 0,
    # and every passing column clears ``loose``
    widest = (p * screen.round_norm.max() + q * screen.bf_norm.max()
              + s * screen.col_norm.max())  # fmt: skip
    t = tau - widest - rel * bmax - _FLOOR
    loose = t - rel * torch.maximum(top_val.abs(), t.abs() / (1.0 - rel))
    if approx.dtype != loose.dtype:  # round the threshold down, never up
        loose = (loose - loose.abs() * 2.0**-6).to(approx.dtype)
    cand = (approx >= loose).any(dim=0).nonzero().squeeze(1)
    sub = approx[:, cand].float()
    cols = (screen.round_norm[cand], screen.bf_norm[cand], screen.col_norm[cand])
    bound = _bound((p, q, s), cols, sub, None if b is None else b.float()[cand])
    return cand[(sub + bound >= tau).any(dim=0)]


def bf16_supported(device: torch.device) -> bool:
    """Whether the screen is fast and its bound holds on ``device``: a CPU whose oneDNN
    build has native bfloat16 (float32 accumulation). Elsewhere the caller uses the plain
    float32 product: CPUs without it emulate bfloat16 (slower), and CUDA may reduce in
    reduced precision (``allow_bf16_reduced_precision_reduction``), which the bound does
    not cover; on a GPU the float32 unembedding is not the bottleneck anyway."""
    if device.type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


def screened_argmax(
    x: Float[Tensor, "row d_model"],
    W: Float[Tensor, "d_model vocab"],
    screen: Screen,
    b: Float[Tensor, " vocab"] | None = None,
) -> Int[Tensor, " row"]:
    """``argmax(x @ W + b)`` per row, in float32, with the bfloat16 screen doing the full-
    vocabulary pass. Equal to the plain float32 arg-max except where two logits agree to
    within float32 round-off (then either may win, as between two float32 kernels)."""
    keep = kept_columns(x, screen, b)
    if keep.numel() > MAX_KEPT:
        return plain_argmax(x, W, b)
    exact = x.float() @ W[:, keep].float()
    if b is not None:
        exact = exact + b.float()[keep]
    return keep[exact.argmax(-1)]


def plain_argmax(
    x: Float[Tensor, "row d_model"], W: Float[Tensor, "d_model vocab"],
    b: Float[Tensor, " vocab"] | None = None,
) -> Int[Tensor, " row"]:  # fmt: skip
    """``argmax(x @ W + b)`` per row: the float32 product over the whole vocabulary."""
    logits = x.float() @ W.float()
    return (logits if b is None else logits + b.float()).argmax(-1)


def _best_seconds(fn: Callable[[], Tensor], repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def screen_is_faster(
    x: Float[Tensor, "row d_model"],
    W: Float[Tensor, "d_model vocab"],
    screen: Screen,
    b: Float[Tensor, " vocab"] | None = None,
    repeats: int = 2,
) -> bool:
    """Whether :func:`screened_argmax` takes less wall time than :func:`plain_argmax` on the
    rows ``x`` here (best of ``repeats`` runs each, after one warm-up). Both give the same
    arg-max; this only says which is cheaper on this machine: CPUs with bfloat16 matrix
    units run the screen's product fast, CPUs that emulate bfloat16 (oneDNN still reports
    support) run it slower than the float32 product."""
    t_screen = _best_seconds(lambda: screened_argmax(x, W, screen, b), repeats)
    t_plain = _best_seconds(lambda: plain_argmax(x, W, b), repeats)
    return t_screen < t_plain

"""Reading residual-stream vectors through the final norm and the unembedding, in chunks.

A full ``[layers, batch, vocab]`` logit tensor is too large to keep (262,144 tokens), so
:func:`read_logits` works through the rows in chunks and keeps only what the analyses read:
the softmax normalizer, the top-k tokens, and for each token set its log-probability mass, the
log-probability of its primary token and the rank of its best token (one fused pass per chunk,
:func:`_softmax_stats`). It runs on the device of ``W_U`` and computes in float32 whatever the
model's dtype. :func:`token_logprobs` reads chosen tokens' log-probabilities,
:func:`final_logits` the logits of final-layer rows, and :func:`greedy_next` the exact greedy
next token (screened in bfloat16, :mod:`mechlingo.kernels.argmax`, where a one-off
measurement finds the screen faster than the plain float32 arg-max).

Why not TransformerLens's ``logit_readout``, and the measured comparison
(``benchmarks/bench_lens.py``): ``docs/methods/logit-lens.md`` and ``docs/benchmarks.md``."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.kernels.argmax import (
    Screen,
    bf16_supported,
    build_screen,
    screen_is_faster,
    screened_argmax,
)

T = TypeVar("T")


@dataclass
class Readout:
    """What the unembedding says about each row.

    Attributes:
        logsumexp: log of the softmax normalizer per row (natural log).
        top_ids, top_logprobs: the ``k`` most likely tokens and their log-probabilities.
        set_logprob: log of the total probability of each token set (``-inf`` for an empty set).
        primary_logprob: log-probability of each set's primary token.
        set_rank: 0-based rank of the best token of each set over the whole vocabulary
            (0 = it is the top prediction); ties count only strictly larger logits.
        entropy: entropy of each row's next-token distribution (nats; ``nan`` where the
            readout streamed the vocabulary and never held the logits).
        energy: token energy of each row (:func:`token_energy`) where ``read_logits`` was
            asked for it, else ``None``.
    """

    logsumexp: Float[Tensor, " row"]
    top_ids: Int[Tensor, "row k"]
    top_logprobs: Float[Tensor, "row k"]
    set_logprob: Float[Tensor, "row track"]
    primary_logprob: Float[Tensor, "row track"]
    set_rank: Int[Tensor, "row track"]
    entropy: Float[Tensor, " row"] | None = None
    energy: Float[Tensor, " row"] | None = None


def apply_final_norm(model: Model, x: Float[Tensor, "row d_model"]) -> Float[Tensor, "row d_model"]:
    """The model's own final norm module on each row (statistics recomputed per row)."""
    ln = getattr(model, "ln_final", None)
    if ln is None:
        return x
    return ln(x.unsqueeze(0)).squeeze(0)


def output_transform(
    model: Model, logits: Float[Tensor, "*row vocab"]
) -> Float[Tensor, "*row vocab"]:
    """The architecture's transform after the unembedding (e.g. Gemma 2's logit soft-cap)."""
    adapter = getattr(model, "adapter", None)
    fn = getattr(adapter, "apply_output_logits_transform", None)
    if callable(fn):
        return fn(logits)
    cap = float(getattr(model.cfg, "output_logits_soft_cap", -1.0) or -1.0)
    if cap > 0:
        return cap * torch.tanh(logits / cap)
    return logits


def _plain_transform(model: Model, device: torch.device) -> bool:
    """Whether the output transform leaves logits as they are (no soft-cap or the like)."""
    probe = torch.linspace(-50.0, 50.0, 11, device=device)
    return torch.equal(output_transform(model, probe.clone()), probe)


def _live_bias(model: Model) -> Float[Tensor, " vocab"] | None:
    """The model's unembedding bias ``b_U``, or ``None`` where it has none or an all-zero
    one (the bridge gives Gemma a zero ``b_U``): the readouts then skip the add."""
    b_U = getattr(model, "b_U", None)
    return b_U if b_U is not None and bool(b_U.any()) else None


def unembed(
    model: Model, x: Float[Tensor, "row d_model"], W_U: Float[Tensor, "d_model vocab"] | None = None
) -> Float[Tensor, "row vocab"]:
    """Logits of already-normalized rows: ``transform(x @ W_U + b_U)``, computed in float32
    whatever the model's dtype (pass a float32 ``W_U`` to avoid converting it per call)."""
    W = (model.W_U if W_U is None else W_U).float()
    b_U = _live_bias(model)
    if b_U is not None:
        logits = torch.addmm(b_U.float(), x.float(), W)  # the bias in the GEMM, no extra pass
    else:
        logits = x.float() @ W
    return output_transform(model, logits)


# Vocabulary columns per step of the streamed normalizer: a [rows, 4096] float32 block stays
# in cache (timing in docs/benchmarks.md).
_VOCAB_CHUNK = 4096


def _streamed_logsumexp(
    model: Model, x: Float[Tensor, "row d_model"], W: Float[Tensor, "d_model vocab"]
) -> Float[Tensor, " row"]:
    """``logsumexp(unembed(x))`` over the vocabulary, a block of columns at a time."""
    b_U = _live_bias(model)  # none or all-zero: no add per block
    lse = torch.full((x.shape[0],), float("-inf"), device=x.device)
    xf = x.float()
    for v0 in range(0, W.shape[1], _VOCAB_CHUNK):
        v1 = min(W.shape[1], v0 + _VOCAB_CHUNK)
        logits = xf @ W[:, v0:v1]
        if b_U is not None:
            logits = logits + b_U[v0:v1].float()
        logits = output_transform(model, logits)  # elementwise (e.g. soft-cap)
        lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=-1))
    return lse


def _token_logits(
    model: Model,
    x: Float[Tensor, "row d_model"],
    W: Float[Tensor, "d_model vocab"],
    ids: Int[Tensor, "row track member"],
) -> Float[Tensor, "row track member"]:
    """The logits of the given token ids only, from their own unembedding columns."""
    cols = W.T[ids]  # [row, track, member, d_model]
    logits = torch.einsum("rd,rsmd->rsm", x.float(), cols)
    b_U = _live_bias(model)
    if b_U is not None:
        logits = logits + b_U.float()[ids]
    return output_transform(model, logits)


def final_logits(model: Model, resid: Float[Tensor, "row d_model"]) -> Float[Tensor, "row vocab"]:
    """The model's next-token logits from final-layer residual rows (norm + unembedding).
    No autograd graph is built (the final norm's parameters require gradients)."""
    dev = model.W_U.device
    with torch.no_grad():
        return unembed(model, apply_final_norm(model, resid.to(dev)))


_SCREENING: dict[str, bool | None] = {"on": None}
_ARGMAX_ROWS = 256  # rows per screened arg-max: a [256, vocab] bfloat16 block (134 MB for Gemma 3)
_PROBE_ROWS = 32  # rows of the one-off timing that chooses the screen (a decoding batch)
#: (device, dtype, d_model, vocab) -> whether the screen measured faster than the plain arg-max
_SCREEN_PAYS: dict[tuple, bool] = {}


@contextlib.contextmanager
def screening(enabled: bool | None) -> Iterator[None]:
    """Inside the block, :func:`greedy_next` uses the bfloat16 screen always (``True``),
    never (``False``), or where it measured faster (``None``, the default): to time it, or
    to rule it out when chasing a discrepancy. The arg-max is the same either way."""
    before = _SCREENING["on"]
    _SCREENING["on"] = enabled
    try:
        yield
    finally:
        _SCREENING["on"] = before


_SCREENS: weakref.WeakKeyDictionary[Any, tuple[tuple, Screen]] = weakref.WeakKeyDictionary()


def _screen(model: Model, W: Tensor) -> Screen | None:
    """The model's bfloat16 screen, rebuilt when ``W_U`` changes (new storage, in-place edit,
    other device); ``None`` where the screen does not apply (see :func:`greedy_next`)."""
    if _SCREENING["on"] is False or not bf16_supported(W.device):
        return None
    if not _plain_transform(model, W.device):
        return None  # a soft-cap or other transform: ties could appear after it
    return _per_unembedding(_SCREENS, model, lambda: build_screen(W))


def _screen_key(W: Tensor) -> tuple:
    return (str(W.device), W.dtype, *W.shape)


def screen_choice(model: Model) -> bool | None:
    """Whether :func:`greedy_next` screens in bfloat16 for this model's unembedding shape on
    this device (its one-off measurement found the screen faster); ``None`` before a call
    has measured it."""
    return _SCREEN_PAYS.get(_screen_key(model.W_U))


def _screen_pays(x: Tensor, W: Tensor, screen: Screen, b: Tensor | None) -> bool:
    """The screen's one-off timing against the plain float32 arg-max, per device, dtype and
    unembedding shape (:data:`_SCREEN_PAYS`), on ``_PROBE_ROWS`` rows of ``x``."""
    if _SCREENING["on"] is True:
        return True
    if x.shape[0] == 0:
        return False
    key = _screen_key(W)
    if key not in _SCREEN_PAYS:
        probe = x[torch.arange(_PROBE_ROWS, device=x.device) % x.shape[0]]
        _SCREEN_PAYS[key] = screen_is_faster(probe, W, screen, b)
    return _SCREEN_PAYS[key]


def greedy_next(model: Model, resid: Float[Tensor, "row d_model"]) -> Int[Tensor, " row"]:
    """The greedy next token of each final-layer residual row: the float32 arg-max of the
    model's logits, found with the bfloat16 screen of :mod:`mechlingo.kernels.argmax` on
    CPUs where the bound holds and a one-off timing found it faster than the plain arg-max
    (:func:`screen_choice`; the screen keeps a bfloat16 copy of ``W_U``), else the plain
    arg-max of :func:`final_logits`. The result is the same either way."""
    dev = model.W_U.device
    with torch.no_grad():
        W = model.W_U
        screen = _screen(model, W)
        if screen is None:
            return final_logits(model, resid).argmax(-1)
        x = apply_final_norm(model, resid.to(dev))
        b = _live_bias(model)  # none or all-zero: no float32 pass over the screen
        if not _screen_pays(x, W, screen, b):
            return final_logits(model, resid).argmax(-1)
        # rows in chunks: the screen's [rows, vocab] bfloat16 block stays bounded however many
        # rows a pass decodes (stacked conditions); each row's arg-max is its own
        parts = [screened_argmax(x[i : i + _ARGMAX_ROWS], W, screen, b)
                 for i in range(0, x.shape[0], _ARGMAX_ROWS)]  # fmt: skip
        return torch.cat(parts) if len(parts) != 1 else parts[0]


def _checked_sets(
    model: Model, n: int, token_sets: Tensor | None, primary: Tensor | None
) -> tuple[Int[Tensor, "row track member"], Int[Tensor, "row track"]]:
    """The token sets and primary ids on the device of ``W_U`` (none: zero tracks)."""
    d_vocab = int(model.W_U.shape[1])
    if token_sets is None:
        token_sets = torch.full((n, 0, 1), -1, dtype=torch.long)
        primary = torch.zeros((n, 0), dtype=torch.long)
    if primary is None:
        primary = token_sets[..., 0].clamp_min(0)
    if token_sets.shape[0] != n or primary.shape[:2] != token_sets.shape[:2]:
        raise InputError(
            f"token_sets {tuple(token_sets.shape)} / primary {tuple(primary.shape)} do not "
            f"match {n} rows"
        )
    if bool((token_sets >= d_vocab).any()) or bool((primary >= d_vocab).any()):
        raise InputError(f"token ids must be < d_vocab={d_vocab}")
    dev = model.W_U.device
    return token_sets.to(dev), primary.to(dev)


def _empty_readout(n: int, k: int, n_track: int, dev: torch.device) -> Readout:
    return Readout(
        logsumexp=torch.empty(n, device=dev),
        top_ids=torch.empty((n, k), dtype=torch.long, device=dev),
        top_logprobs=torch.empty((n, k), device=dev),
        set_logprob=torch.empty((n, n_track), device=dev),
        primary_logprob=torch.empty((n, n_track), device=dev),
        set_rank=torch.empty((n, n_track), dtype=torch.long, device=dev),
        entropy=torch.full((n,), float("nan"), device=dev),
    )


def _read_streamed(
    model: Model, x: Tensor, W: Tensor, ids: Tensor, primary: Tensor, out: Readout, rows: slice
) -> None:
    """Normalizers and the set tokens' logits only: stream over the vocabulary (the
    ``[c, vocab]`` logits never exist) and read the set tokens' logits
    from their own unembedding columns. Ranks are ``-1``."""
    norm = _streamed_logsumexp(model, x, W)
    out.logsumexp[rows] = norm
    if not ids.shape[1]:
        return
    tok = _token_logits(model, x, W, ids.clamp_min(0))  # [c, s, m]
    tok = tok.masked_fill(ids < 0, float("-inf"))
    out.set_logprob[rows] = torch.logsumexp(tok, dim=-1) - norm[:, None]
    prim = _token_logits(model, x, W, primary[:, :, None])[..., 0]
    out.primary_logprob[rows] = prim - norm[:, None]
    out.set_rank[rows] = -1


# Vocabulary columns per step of the fused softmax pass of :func:`_read_full`: the block of
# logits and its exponentials stay in cache, so the pass reads each logit once from memory
# (the block size was timed: docs/benchmarks.md).
_STATS_BLOCK = 1024


def _softmax_stats(
    logits: Tensor, top: Tensor, best: Tensor | None, mean: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """One pass over the vocabulary, a block of columns at a time: per row ``z = sum(p)`` and
    ``p . logits`` with ``p = exp(logits - top)`` (the unnormalised softmax: logsumexp =
    ``top + log z``, entropy = ``logsumexp - (p . logits) / z``, a dot product, closer to
    float64 than summing softmax * logits), and, if ``best`` ``[row, set]`` is given, the
    number of logits of each row strictly above each set's best logit (the set ranks), and, if
    each row's ``mean`` logit is given, the sum of squared deviations from it (the numerator
    of the token energy). The blocks' float32 sums are added up in float64 (``z``,
    ``p . logits`` and the squares are float64)."""
    n, vocab = logits.shape
    z = torch.zeros(n, dtype=torch.float64, device=logits.device)
    dot = torch.zeros(n, dtype=torch.float64, device=logits.device)
    above = None if best is None else torch.zeros(best.shape, dtype=torch.long, device=z.device)
    sq = None if mean is None else torch.zeros(n, dtype=torch.float64, device=z.device)
    for v0 in range(0, vocab, _STATS_BLOCK):
        block = logits[:, v0 : v0 + _STATS_BLOCK]
        p = torch.sub(block, top).exp_()
        z += p.sum(-1)
        dot += torch.linalg.vecdot(p, block)
        if above is not None and best is not None:
            above += (block.unsqueeze(1) > best.unsqueeze(-1)).sum(-1, dtype=torch.int32)
        if sq is not None and mean is not None:
            diff = torch.sub(block, mean.unsqueeze(1))
            sq += torch.linalg.vecdot(diff, diff)
    return z, dot, above, sq


def _read_full(
    model: Model,
    x: Tensor,
    W: Tensor,
    ids: Tensor,
    primary: Tensor,
    out: Readout,
    rows: slice,
    *,
    k: int,
    ranks: bool,
    centre: tuple[Tensor, Tensor] | None = None,
) -> None:
    """The whole ``[c, vocab]`` logits of a chunk: normalizer, top-k, sets and ranks (and the
    token energy, given the unembedding's centre, :func:`_vocab_centre`, and plain logits).
    Past the unembedding GEMM, one pass for the top-k (its first value is the row's maximum)
    and one fused pass (:func:`_softmax_stats`) for everything else."""
    logits = unembed(model, x, W)  # [c, vocab] float32
    top_ids: Tensor | None = None
    if k == 1:  # one max pass gives the top token and the softmax shift
        top_values, top_ids = logits.max(dim=-1, keepdim=True)
    elif k:
        top_values, top_ids = torch.topk(logits, k, dim=-1)
    else:
        top_values = logits.amax(dim=-1, keepdim=True)
    top = top_values[:, :1]
    n_track = ids.shape[1]
    gathered: Tensor | None = None
    set_best: Tensor | None = None
    if n_track:
        gathered = torch.gather(logits.unsqueeze(1).expand(-1, n_track, -1), 2, ids.clamp_min(0))
        gathered = gathered.masked_fill(ids < 0, float("-inf"))  # [c, s, m]
        set_best = gathered.max(dim=-1).values if ranks else None
    mean = None if centre is None else x.float() @ centre[0]  # each row's mean logit
    z, dot, above, sq = _softmax_stats(logits, top, set_best, mean)
    norm = top[:, 0] + z.log()
    out.logsumexp[rows] = norm
    out.entropy[rows] = norm - dot / z
    if sq is not None and centre is not None and out.energy is not None:
        out.energy[rows] = (sq / _sq_norm(x) / centre[1]).float()
    if top_ids is not None:
        out.top_ids[rows] = top_ids
        out.top_logprobs[rows] = top_values - norm[:, None]
    if gathered is None:
        return
    out.set_logprob[rows] = torch.logsumexp(gathered, dim=-1) - norm[:, None]
    out.primary_logprob[rows] = torch.gather(logits, 1, primary) - norm[:, None]
    out.set_rank[rows] = above if above is not None else -1


def _row_chunks(
    model: Model, resid: Tensor, chunk_rows: int, apply_norm: bool
) -> Iterator[tuple[slice, Tensor]]:
    """``(rows, x)`` for consecutive chunks of ``chunk_rows`` rows of ``resid``: ``x`` is
    those rows on the device of ``W_U``, through the final norm unless ``apply_norm`` is
    ``False``."""
    dev = model.W_U.device
    n = resid.shape[0]
    for start in range(0, n, chunk_rows):
        rows = slice(start, min(n, start + chunk_rows))
        x = resid[rows].to(dev)
        yield rows, (apply_final_norm(model, x) if apply_norm else x)


def read_logits(
    model: Model,
    resid: Float[Tensor, "row d_model"],
    token_sets: Int[Tensor, "row track member"] | None = None,
    primary: Int[Tensor, "row track"] | None = None,
    *,
    top_k: int = 5,
    chunk_rows: int = 64,
    apply_norm: bool = True,
    ranks: bool = True,
    energy: bool = False,
) -> Readout:
    """Read rows of the residual stream through the final norm and unembedding.

    Args:
        model: a TransformerLens model (bridge or HookedTransformer).
        resid: residual-stream vectors, one per row.
        token_sets: per row, ``track`` token sets padded with ``-1`` (see
            :func:`mechlingo.core.answers.pack_token_sets`).
        primary: per row and set, the primary token id.
        top_k: how many top tokens to keep per row (0 for none).
        chunk_rows: rows per unembedding matmul; memory is ``chunk_rows x vocab`` floats.
        apply_norm: apply ``ln_final`` first (``False`` reads the raw vectors, which does not
            reproduce the model).
        ranks: compute ``set_rank`` (a comparison over the whole vocabulary per set); with
            ``False`` it is filled with ``-1``.
        energy: fill ``Readout.energy`` (:func:`token_energy`): from the logits the readout
            holds anyway where they are plain (``x W_U``: no bias, no output transform), else
            from the unembedding's Gram matrix.

    Returns:
        A :class:`Readout` on the device of ``W_U``.

    Raises:
        InputError: ``resid`` is not 2-D, ``chunk_rows`` < 1, or the token sets do not match
            the rows or the vocabulary.
    """
    if resid.ndim != 2:
        raise InputError(f"resid must be [rows, d_model], got shape {tuple(resid.shape)}")
    if chunk_rows < 1:
        raise InputError("chunk_rows must be >= 1")
    dev = model.W_U.device
    n = resid.shape[0]
    token_sets, primary = _checked_sets(model, n, token_sets, primary)
    k = min(top_k, int(model.W_U.shape[1]))
    out = _empty_readout(n, k, token_sets.shape[1], dev)
    W_U32 = model.W_U.detach().float()  # converted once (a no-op for float32 models)
    centre = None
    if energy:
        out.energy = torch.empty(n, device=dev)
        if (k or ranks) and _live_bias(model) is None and _plain_transform(model, dev):
            centre = _vocab_centre(model, W_U32)
    with torch.no_grad():
        for rows, x in _row_chunks(model, resid, chunk_rows, apply_norm):
            if not k and not ranks:
                _read_streamed(model, x, W_U32, token_sets[rows], primary[rows], out, rows)
            else:
                args = (model, x, W_U32, token_sets[rows], primary[rows], out, rows)
                _read_full(*args, k=k, ranks=ranks, centre=centre)
            if energy and centre is None:  # a bias, a transform, or the streamed readout
                out.energy[rows] = _gram_energy(model, W_U32, x)
    return out


# --------------------------------------------------------------------------------------
# Token energy
# --------------------------------------------------------------------------------------

#: per model: (the key of its ``W_U``, (mean column, ``||Wc||_F^2 / d_model``))
_CENTRES: weakref.WeakKeyDictionary[Any, tuple[tuple, tuple[Tensor, Tensor]]] = (
    weakref.WeakKeyDictionary()
)
#: per model: (the key of its ``W_U``, the normalised Gram matrix of :func:`_energy_gram`)
_GRAMS: weakref.WeakKeyDictionary[Any, tuple[tuple, Tensor]] = weakref.WeakKeyDictionary()


def _unembed_key(model: Model) -> tuple:
    """What identifies the model's ``W_U`` now: storage, in-place version, shape, type, device."""
    W = model.W_U
    return (W.data_ptr(), getattr(W, "_version", 0), tuple(W.shape), W.dtype, W.device)


def _per_unembedding(table: weakref.WeakKeyDictionary, model: Model, build: Callable[[], T]) -> T:
    """``build()``, kept in ``table`` for ``model`` until its ``W_U`` changes (new storage,
    in-place edit, other device: :func:`_unembed_key`)."""
    key = _unembed_key(model)
    hit = table.get(model)
    if hit is None or hit[0] != key:
        hit = (key, build())
        table[model] = hit
    return hit[1]


def _sq_norm(x: Tensor) -> Tensor:
    return (x.float() * x.float()).sum(-1).clamp_min(1e-30)


def _vocab_centre(model: Model, W: Float[Tensor, "d_model vocab"]) -> tuple[Tensor, Tensor]:
    """The unembedding's mean column ``mu`` (a row's mean logit is ``x . mu``) and
    ``||Wc||_F^2 / d_model`` with ``Wc = W - mu`` (the token energy's divisor), from the
    float32 ``W``; memoised per model while its ``W_U`` is unchanged."""

    def build() -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            mu = W.mean(dim=1)
            total = torch.zeros((), dtype=torch.float64, device=W.device)
            for v0 in range(0, W.shape[1], _VOCAB_CHUNK):
                total += (
                    (W[:, v0 : v0 + _VOCAB_CHUNK] - mu[:, None]).pow(2).sum(dtype=torch.float64)
                )
        return mu, total / W.shape[0]

    return _per_unembedding(_CENTRES, model, build)


def _energy_gram(model: Model, W: Float[Tensor, "d_model vocab"]) -> Tensor:
    """``Wc Wc^T / (||Wc||_F^2 / d)`` with ``Wc`` the float32 unembedding ``W`` centred over
    the vocabulary (its centre and divisor: :func:`_vocab_centre`); memoised per model while
    its ``W_U`` is unchanged."""

    def build() -> Tensor:
        mu, divisor = _vocab_centre(model, W)
        with torch.no_grad():
            Wc = W - mu[:, None]
            return (Wc @ Wc.T) / divisor.float()

    return _per_unembedding(_GRAMS, model, build)


def _gram_energy(model: Model, W: Tensor, x: Tensor) -> Tensor:
    """The token energy of already-normalised rows ``x`` from the Gram matrix."""
    xf = x.float()
    return ((xf @ _energy_gram(model, W)) * xf).sum(-1) / _sq_norm(xf)


def token_energy(model: Model, rows: Float[Tensor, "row d_model"]) -> Float[Tensor, " row"]:
    """Token energy of decoded rows (after the final norm), in the spirit of Wendler et al.
    (2024): the squared norm of the row's projection on the vocabulary-centred unembedding,
    ``||Wc^T x||^2 / ||x||^2``, divided by its expected value for a random direction
    (``||Wc||_F^2 / d``). 1 = no more aligned with token directions than chance; high =
    the row points where the unembedding reads tokens. ``read_logits(..., energy=True)``
    gives the same numbers beside the other readouts, mostly without this Gram matrix."""
    with torch.no_grad():
        x = apply_final_norm(model, rows.to(model.W_U.device))
        return _gram_energy(model, model.W_U.detach().float(), x)


def token_logprobs(
    model: Model,
    resid: Float[Tensor, "row d_model"],
    targets: Int[Tensor, " row"],
    *,
    chunk_rows: int = 512,
    apply_norm: bool = True,
) -> Float[Tensor, " row"]:
    """The log-probability of one target token per final-layer residual row:
    ``logit[target] - logsumexp(logits)``, computed in float32 without materialising a
    ``[rows, vocab]`` log-softmax: the normalizer is streamed over blocks of the vocabulary,
    once per distinct row (equal rows asked for different targets share it), and the target
    logit is read from its own unembedding column.

    Args:
        resid: final-layer residual rows (before the final norm unless ``apply_norm`` is
            ``False``).
        targets: the token id whose log-probability each row is asked for.
        chunk_rows: rows per streamed pass (memory ``chunk_rows x 4096`` floats).

    Returns:
        Natural-log probabilities on the device of ``W_U``.
    """
    if resid.ndim != 2 or targets.ndim != 1 or targets.shape[0] != resid.shape[0]:
        raise InputError(
            f"resid must be [rows, d_model] and targets [rows], got {tuple(resid.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if chunk_rows < 1:
        raise InputError("chunk_rows must be >= 1")
    dev = model.W_U.device
    n = resid.shape[0]
    out = torch.empty(n, device=dev)
    W_U32 = model.W_U.detach().float()
    tgt = targets.to(dev).long()
    if n and (int(tgt.min()) < 0 or int(tgt.max()) >= W_U32.shape[1]):
        raise InputError(f"target ids must be in [0, {W_U32.shape[1]})")
    with torch.no_grad():
        # rows asked for several targets (the candidates of one prompt, read at its last
        # token) share one normalizer: the vocabulary pass runs once per distinct row
        uniq, inverse = torch.unique(resid, dim=0, return_inverse=True)
        norms = torch.empty(uniq.shape[0], device=dev)
        for rows, x in _row_chunks(model, uniq, chunk_rows, apply_norm):
            norms[rows] = _streamed_logsumexp(model, x, W_U32)
        inverse = inverse.to(dev)
        for rows, x in _row_chunks(model, resid, chunk_rows, apply_norm):
            tok = _token_logits(model, x, W_U32, tgt[rows][:, None, None])[:, 0, 0]
            out[rows] = tok - norms[inverse[rows]]
    return out

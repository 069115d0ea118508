"""A tuned lens (Belrose et al. 2023): one learned affine translator per layer.

Before the final norm and unembedding, the residual state after ``l`` blocks is mapped to
``h + A_l h + b_l`` (the identity at the start; none at the output entry), trained so that
the lens's next-token distribution matches the model's own final one.

Entry points: :func:`train_tuned_lens` (data-parallel under ``torchrun``) on a text or
:func:`mix_texts`' language-balanced mix; :class:`TunedLens` (``save``; :func:`load_tuned_lens`
refuses another model); :func:`lens_divergence` (held-out KL against the logit lens).
``docs/methods/logit-lens.md`` ("The tuned lens") has the objective, its sampled form, the
learning rate, the cost and what the lenses show.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from safetensors.torch import save
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.runs import StopForward, run_batch
from mechlingo.analyses.decoders.entries import lens_hook_names
from mechlingo.analyses.decoders.options import TrainingOptions
from mechlingo.analyses.decoders.registry import DecoderOption, register_decoder
from mechlingo.core.artifacts import atomic_folder
from mechlingo.core.defaults import SEED
from mechlingo.core.describe import check_model, model_info
from mechlingo.core.distributed import all_reduce_state, dist_info, shard
from mechlingo.core.errors import ArtifactError, InputError, MissingArtifactError
from mechlingo.core.sites import site_map
from mechlingo.core.tokens import TokenBatch, encode
from mechlingo.core.types import Model
from mechlingo.core.untrusted import (
    check_links,
    load_tensors,
    read_json,
    refuse_special,
    safetensors_header,
)
from mechlingo.core.version import __version__
from mechlingo.kernels.readout import apply_final_norm, output_transform, unembed
from mechlingo.kernels.significance import bootstrap_mean
from mechlingo.viz.common import html_summary
from mechlingo.viz.lens import tuned_lens_loss_figure

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "HELDOUT_BATCH_SIZE",
    "NO_TUNED_LENS",
    "TUNED",
    "TunedLens",
    "TunedLensTraining",
    "lens_divergence",
    "load_tuned_lens",
    "mix_texts",
    "token_residuals",
    "train_tuned_lens",
    "translator_kl",
]

#: The tuned lens's registered decoder name.
TUNED = "tuned"

FORMAT_VERSION = 1
#: texts per forward pass of the held-out KL (whole lines, longer than fact prompts)
HELDOUT_BATCH_SIZE = 8
_META_FILE = "tuned_lens.json"
_TENSORS_FILE = "translators.safetensors"


class TunedLens(torch.nn.Module):
    """Affine translators for lens entries ``0..n-1`` (entry ``n``, the output, is the
    identity).

    Attributes:
        weight: ``[n_layers, d_model, d_model]``, ``A_l`` of each entry (zero = identity).
        bias: ``[n_layers, d_model]``, ``b_l``.
        model_info: the description of the model the lens belongs to
            (:func:`mechlingo.core.describe.model_info`); checked on load and on use.
        meta: how it was trained (data, steps, tokens, loss), carried into the saved file.
    """

    #: The decoder's name (:class:`~mechlingo.analyses.decoders.registry.Decoder`).
    name: str = TUNED

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        *,
        info: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if n_layers < 1 or d_model < 1:
            raise InputError(f"a tuned lens needs n_layers >= 1 and d_model >= 1, got {n_layers}")
        self.weight = torch.nn.Parameter(torch.zeros(n_layers, d_model, d_model))
        self.bias = torch.nn.Parameter(torch.zeros(n_layers, d_model))
        self.model_info: dict[str, Any] = dict(info or {})
        self.meta: dict[str, Any] = dict(meta or {})

    @classmethod
    def for_model(cls, model: Model) -> TunedLens:
        """An identity lens (every translator zero) for ``model``: equal to the logit lens."""
        n, d = site_map(model).n_layers, int(model.cfg.d_model)
        lens = cls(n, d, info=model_info(model))
        return lens.to(model.W_U.device)

    @property
    def n_layers(self) -> int:
        return int(self.weight.shape[0])

    def forward(self, h: Float[Tensor, "... d_model"], entry: int) -> Float[Tensor, "... d_model"]:
        """Translate residual vectors read at lens ``entry`` (``entry == n_layers``: unchanged)."""
        if not 0 <= entry <= self.n_layers:
            raise InputError(f"lens entry {entry} is out of range 0..{self.n_layers}")
        if entry == self.n_layers:
            return h
        x = h.to(self.weight.dtype)
        return x + x @ self.weight[entry].T + self.bias[entry]

    def translate(
        self, entries: Sequence[int], acts: Float[Tensor, "entry row d_model"]
    ) -> Float[Tensor, "entry row d_model"]:
        """Translate a stack of rows read at ``entries`` (one slice per entry), no gradient."""
        if acts.shape[0] != len(entries):
            raise InputError(f"{acts.shape[0]} slices of rows for {len(entries)} entries")
        with torch.no_grad():
            dev = self.weight.device
            out = [self(acts[i].to(dev), int(e)).to(acts.device) for i, e in enumerate(entries)]
        return torch.stack(out)

    def decode(
        self,
        model: Model,
        entries: Sequence[int],
        acts: Float[Tensor, "entry row d_model"],
        langs: Sequence[str] | None = None,
    ) -> Float[Tensor, "entry row d_model"]:
        """The decoder interface of :func:`mechlingo.analyses.decoders.lens.logit_lens`: the translated
        rows, to be read through the final norm and unembedding (``langs`` is unused: a tuned
        lens has one translator per layer for every language)."""
        return self.translate(entries, acts)

    def check(self, model: Model, where: str = "the tuned lens") -> None:
        """Raise :class:`~mechlingo.core.errors.ModelMismatchError` if ``model`` is not the model
        the lens was trained on (sizes, weight mode, unembedding fingerprint)."""
        check_model(self.model_info, model, what=where)
        if self.n_layers != site_map(model).n_layers:
            raise InputError(f"{where} has {self.n_layers} translators for a model of "
                             f"{site_map(model).n_layers} blocks")  # fmt: skip

    def files(self) -> dict[str, bytes]:
        """The saved form: ``{file name: bytes}`` (translators and the JSON description)."""
        doc = {"format": FORMAT_VERSION, "kind": "tuned_lens", "model": self.model_info}
        doc |= {"meta": self.meta, "mechlingo": __version__}
        tensors = {"weight": self.weight.detach().cpu().contiguous(),
                   "bias": self.bias.detach().cpu().contiguous()}  # fmt: skip
        text = json.dumps(doc, indent=2, ensure_ascii=False, default=str)
        return {_TENSORS_FILE: save(tensors), _META_FILE: text.encode("utf-8")}

    def save(self, path: str | Path) -> Path:
        """Write the lens to the folder ``path`` in one step (a kill leaves the old folder)."""
        path = Path(path)
        with atomic_folder(path, keep_others=False) as tmp:
            for name, content in self.files().items():
                (tmp / name).write_bytes(content)
        return path

    @classmethod
    def load(cls, path: str | Path, model: Model | None = None) -> TunedLens:
        """Load a lens saved by :meth:`save` (see :func:`load_tuned_lens`)."""
        return load_tuned_lens(path, model)


def load_tuned_lens(path: str | Path, model: Model | None = None) -> TunedLens:
    """Load a tuned lens folder; with ``model``, check that the lens was trained on it and
    move it to the model's device.

    Raises:
        MissingArtifactError: ``path`` holds no saved lens.
        ArtifactError: the files are corrupt or do not match each other.
        ModelMismatchError: the lens was trained on another model.
    """
    path = Path(path)
    meta_path, tensor_path = path / _META_FILE, path / _TENSORS_FILE
    fix = "train it again with `mechlingo tuned-lens --out DIR`"
    for p in (path, meta_path, tensor_path):
        refuse_special(p, ArtifactError, fix=fix)
    if not meta_path.is_file() or not tensor_path.is_file():
        raise MissingArtifactError(
            f"{path} holds no tuned lens ({_META_FILE} + {_TENSORS_FILE} expected)", fix=fix
        )
    check_links(path, ArtifactError, fix=fix)
    doc = read_json(meta_path, ArtifactError, fix=fix)  # check_links: nothing links out
    if not isinstance(doc, dict) or doc.get("kind") != "tuned_lens":
        raise ArtifactError(f"{meta_path} does not describe a tuned lens", fix=fix)
    if doc.get("format") != FORMAT_VERSION:
        raise ArtifactError(f"{path}: unsupported tuned-lens format {doc.get('format')!r}", fix=fix)
    if not isinstance(doc.get("model") or {}, dict) or not isinstance(doc.get("meta") or {}, dict):
        raise ArtifactError(f"{meta_path}: 'model' and 'meta' must be JSON objects", fix=fix)
    header = safetensors_header(tensor_path, ArtifactError, fix=fix)
    ws, bs = header.get("weight", (None, ()))[1], header.get("bias", (None, ()))[1]
    if set(header) != {"weight", "bias"} or len(ws) != 3 or ws[1] != ws[2] or bs != ws[:2]:
        raise ArtifactError(f"{tensor_path} does not hold [n, d, d] / [n, d] translators", fix=fix)
    if model is not None:  # sizes against the model before the weights are read
        want = (site_map(model).n_layers, int(model.cfg.d_model))
        if ws[:2] != want:
            raise ArtifactError(f"{tensor_path} holds {ws[0]} translators of width {ws[1]}; "
                                f"the model has {want[0]} blocks of width {want[1]}", fix=fix)  # fmt: skip
    tensors = load_tensors(tensor_path, ArtifactError, fix=fix, expect={"weight": ws, "bias": bs})
    w, b = tensors["weight"], tensors["bias"]
    lens = TunedLens(int(w.shape[0]), int(w.shape[1]), info=doc.get("model"), meta=doc.get("meta"))
    with torch.no_grad():
        lens.weight.copy_(w)
        lens.bias.copy_(b)
    if model is not None:
        lens.check(model, where=f"the tuned lens in {path}")
        lens = lens.to(model.W_U.device)
    return lens


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------


def mix_texts(by_lang: Mapping[str, Sequence[str]], n_per_lang: int | None = None) -> list[str]:
    """A language-balanced list: the first ``n_per_lang`` non-empty lines of every language
    (default: as many as the shortest language has), interleaved (line 0 of each language,
    then line 1, ...), so every prefix of the list is balanced too."""
    clean = {lg: [t for t in texts if t.strip()] for lg, texts in by_lang.items()}
    if not clean or not all(clean.values()):
        empty = [lg for lg, t in clean.items() if not t]
        raise InputError(f"no text for language(s) {empty or 'any'} to mix")
    n = min(len(t) for t in clean.values()) if n_per_lang is None else int(n_per_lang)
    return [clean[lg][i] for i in range(n) for lg in clean if i < len(clean[lg])]


def _truncated(batch: TokenBatch, max_tokens: int) -> TokenBatch:
    lengths = batch.lengths.clamp(max=max_tokens)
    width = int(lengths.max())
    return TokenBatch(batch.tokens[:, :width], lengths, batch.pad_id, batch.has_bos)


def token_residuals(
    model: Model,
    texts: Sequence[str],
    entries: Sequence[int],
    *,
    max_tokens: int = 64,
) -> tuple[Float[Tensor, "entry token d_model"], list[int]]:
    """The residual stream at every real token (BOS excluded) of ``texts`` at ``entries``.

    Returns:
        ``(acts, text_index)``: ``acts[e, t]`` is token ``t`` read at ``entries[e]``
        (float32), ``text_index[t]`` the text it comes from. Texts are cut to
        ``max_tokens`` tokens.
    """
    batch = _truncated(encode(model, list(texts)), max_tokens)
    names = lens_hook_names(model, entries)
    keep = batch.real_token_mask(include_bos=False)
    if not bool(keep.any()):
        raise InputError("the texts have no tokens besides BOS")
    grabbed: dict[str, Tensor] = {}
    wanted = set(names)

    def make(name: str) -> Any:
        def grab(t: Tensor, hook: Any) -> None:
            grabbed[name] = t[keep.to(t.device)].detach().float()
            wanted.discard(name)
            if not wanted:
                raise StopForward

        return grab

    run_batch(model, batch, [(nm, make(nm)) for nm in dict.fromkeys(names)])
    rows = torch.arange(batch.batch_size).unsqueeze(1).expand_as(keep)[keep].tolist()
    return torch.stack([grabbed[nm] for nm in names]), rows


# --------------------------------------------------------------------------------------
# The objective
# --------------------------------------------------------------------------------------


def _target_logp(model: Model, final: Tensor, W: Tensor) -> Tensor:
    with torch.no_grad():
        return torch.log_softmax(unembed(model, apply_final_norm(model, final), W), dim=-1)


def translator_kl(
    model: Model,
    lens: TunedLens | None,
    entry: int,
    h: Float[Tensor, "row d_model"],
    target_logp: Float[Tensor, "row vocab"],
    W: Float[Tensor, "d_model vocab"] | None = None,
) -> Float[Tensor, " row"]:
    """``KL(p_final || p_lens)`` per row (nats), the tuned lens's training objective: the
    lens distribution is ``softmax(unembed(final_norm(h + A h + b)))`` (``lens=None``: the
    logit lens). Differentiable in the lens's parameters."""
    W = model.W_U.detach().float() if W is None else W
    x = h if lens is None else lens(h.to(lens.weight.device), entry)
    logq = torch.log_softmax(unembed(model, apply_final_norm(model, x.to(W.device)), W), dim=-1)
    return (target_logp.exp() * (target_logp - logq)).sum(-1)


def _cols_logits(model: Model, x: Tensor, W: Tensor, cols: Tensor) -> Tensor:
    """Logits of the vocabulary columns ``cols`` only (bias and output transform included)."""
    logits = x.float() @ W[:, cols]
    b_U = getattr(model, "b_U", None)
    if b_U is not None:
        logits = logits + b_U.float()[cols]
    return output_transform(model, logits)


@dataclass
class _SampledTarget:
    """The target of a chunk restricted to its support ``cols`` plus a remainder bucket."""

    cols: Tensor  # [s] the union of the chunk's target top-k tokens
    rest: Tensor  # [m] a uniform sample of the other tokens
    n_rest: int  # how many tokens are outside ``cols``
    logp: Tensor  # [row, s] exact target log-probabilities of ``cols``
    p_rest: Tensor  # [row] exact target mass outside ``cols``

    @classmethod
    def build(cls, logp: Tensor, top_k: int, sample: int, gen: torch.Generator) -> _SampledTarget:
        V = logp.shape[1]
        cols = torch.unique(torch.topk(logp, min(top_k, V), dim=-1).indices)
        outside = torch.ones(V, dtype=torch.bool, device=logp.device)
        outside[cols] = False
        perm = torch.randperm(V, generator=gen).to(logp.device)
        rest = perm[outside[perm]][:sample]
        lp = logp[:, cols]
        n_rest = int(outside.sum())
        p_rest = (1 - torch.logsumexp(lp, dim=-1).exp()).clamp_min(0)
        if not n_rest:  # the support is the vocabulary: the remainder is rounding error
            p_rest = torch.zeros_like(p_rest)
        return cls(cols, rest, n_rest, lp, p_rest)


def sampled_translator_kl(
    model: Model,
    lens: TunedLens | None,
    entry: int,
    h: Float[Tensor, "row d_model"],
    target: _SampledTarget,
    W: Float[Tensor, "d_model vocab"],
) -> Float[Tensor, " row"]:
    """The cheap training objective for large vocabularies: ``KL`` between the target and the
    lens over the target's support (its top tokens) plus one bucket for every other token,
    whose lens mass is estimated from a uniform sample of those tokens (``sum over the
    bucket ~ n_rest / m x sum over the sample``). Exact when the sample is the whole rest."""
    x = h if lens is None else lens(h.to(lens.weight.device), entry)
    x = apply_final_norm(model, x.to(W.device))
    z_s = _cols_logits(model, x, W, target.cols)
    lse_s = torch.logsumexp(z_s, dim=-1)
    if target.rest.numel():
        z_r = _cols_logits(model, x, W, target.rest)
        lse_r = torch.logsumexp(z_r, dim=-1) + math.log(target.n_rest / target.rest.numel())
        lse = torch.logaddexp(lse_s, lse_r)
    else:
        lse_r, lse = torch.full_like(lse_s, float("-inf")), lse_s
    kl_s = (target.logp.exp() * (target.logp - (z_s - lse[:, None]))).sum(-1)
    log_q_rest = (lse_r - lse).clamp_min(-1e4)
    return kl_s + torch.xlogy(target.p_rest, target.p_rest) - target.p_rest * log_q_rest


def _step_grads(
    model: Model,
    lens: TunedLens,
    acts: Tensor,
    W: Tensor,
    chunk_rows: int,
    sampling: tuple[int, int, torch.Generator] | None,
) -> tuple[dict[str, Tensor], Tensor]:
    """Gradient sums of the summed per-token KL of every entry over this rank's tokens, and
    the per-entry KL sums (``sampling``: ``(top_k, sample, generator)`` for the sampled
    objective, ``None`` for the exact one)."""
    n = lens.n_layers
    gw, gb = torch.zeros_like(lens.weight), torch.zeros_like(lens.bias)
    sums = torch.zeros(n, device=lens.weight.device)
    for r0 in range(0, acts.shape[1], chunk_rows):
        logp = _target_logp(model, acts[n, r0 : r0 + chunk_rows], W)
        target = _SampledTarget.build(logp, *sampling) if sampling else logp
        del logp
        for e in range(n):
            h = acts[e, r0 : r0 + chunk_rows]
            with torch.enable_grad():
                if sampling:
                    kl = sampled_translator_kl(model, lens, e, h, target, W).sum()
                else:
                    kl = translator_kl(model, lens, e, h, target, W).sum()
                dw, db = torch.autograd.grad(kl, [lens.weight, lens.bias])
            gw += dw
            gb += db
            sums[e] += kl.detach()
    return {"weight": gw, "bias": gb}, sums


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------


@dataclass
class TunedLensTraining:
    """A trained lens and how its training went.

    Attributes:
        lens: the trained :class:`TunedLens`.
        loss: ``[step, entry]`` mean KL(final || lens) over each step's training tokens.
        tokens: ``[step]`` tokens per step (all ranks).
        seconds: wall-clock training time.
        world_size: processes that trained it.
        config: the training settings.
    """

    lens: TunedLens
    loss: Float[Tensor, "step entry"]
    tokens: list[int]
    seconds: float
    world_size: int
    config: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"TunedLensTraining({self.loss.shape[0]} steps, {sum(self.tokens)} tokens, "
            f"{self.seconds:.0f} s, {self.world_size} process(es))"
        )

    def _repr_html_(self) -> str:
        """Mean training KL over entries at the first and the last step, with the tokens."""
        m = self.loss.mean(1)
        rows = [{"step": s + 1, "mean KL (nats)": float(m[s]), "tokens": self.tokens[s]}
                for s in sorted({0, self.loss.shape[0] - 1})]  # fmt: skip
        return html_summary(repr(self), rows)

    def summary(self) -> dict[str, Any]:
        """Steps, tokens, time, and the first and last steps' mean loss per entry."""
        k = max(1, min(5, self.loss.shape[0] // 5))
        return {
            "steps": int(self.loss.shape[0]),
            "tokens": int(sum(self.tokens)),
            "seconds": round(self.seconds, 1),
            "world_size": self.world_size,
            "loss_first_steps": self.loss[:k].mean(0).tolist(),
            "loss_last_steps": self.loss[-k:].mean(0).tolist(),
            "config": self.config,
        }

    def fig_loss(self) -> go.Figure:
        """The loss curve: mean KL per step, one line per entry."""
        return tuned_lens_loss_figure(
            self.loss, n_tokens=sum(self.tokens), seconds=self.seconds, world_size=self.world_size
        )


def _lr_factor(step: int, warmup: int, frac_done: float) -> float:
    """Linear warm-up over ``warmup`` steps, then linear decay to 0 as the budget (steps or
    seconds) runs out."""
    return min(1.0, (step + 1) / warmup) * max(0.0, 1.0 - frac_done)


@dataclass
class _Adam:
    """Adam (betas 0.9, 0.99) with a learning rate per lens entry: an entry whose logit
    lens is already close to the output (small first-step KL) takes proportionally smaller
    steps (``scale = min(1, KL_0 / median KL_0)``), so that gradient noise does not push a
    nearly-right translator away from the identity."""

    params: list[torch.nn.Parameter]
    m: list[Tensor] = field(default_factory=list)
    v: list[Tensor] = field(default_factory=list)
    t: int = 0
    scale: Tensor | None = None

    def step(self, lr: float, kl: Tensor, b1: float = 0.9, b2: float = 0.99) -> None:
        if self.scale is None:
            self.scale = (kl / kl.median().clamp_min(1e-12)).clamp(max=1.0)
            self.m = [torch.zeros_like(p) for p in self.params]
            self.v = [torch.zeros_like(p) for p in self.params]
        self.t += 1
        with torch.no_grad():
            for p, m, v in zip(self.params, self.m, self.v, strict=True):
                g = p.grad
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                upd = (m / (1 - b1**self.t)) / ((v / (1 - b2**self.t)).sqrt() + 1e-8)
                shape = (-1,) + (1,) * (p.ndim - 1)
                p.sub_(lr * self.scale.to(p.device).reshape(shape) * upd)


def _step_texts(texts: Sequence[str], per_step: int, seed: int) -> Iterator[list[str]]:
    """The same endless sequence of step batches on every rank: a seeded shuffle, cycled."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    pos = 0
    while True:
        yield [texts[order[(pos + i) % len(order)]] for i in range(per_step)]
        pos += per_step


def _sampling(model: Model, vocab_sample: int | str | None, top_k: int, seed: int) -> Any:
    """``(top_k, sample, generator)`` for the sampled objective, or ``None`` (exact)."""
    V = int(model.W_U.shape[1])
    if vocab_sample == "auto":
        vocab_sample = None if V <= 32768 else 4096
    if vocab_sample is None:
        return None
    if int(vocab_sample) < 0:
        raise InputError(f"vocab_sample must be >= 0, got {vocab_sample}")
    gen = torch.Generator().manual_seed(seed * 1009 + dist_info().rank)
    return (int(top_k), int(vocab_sample), gen)


def _rank_step(model: Model, lens: TunedLens, texts: list[str], cfg: dict[str, Any],
               W: Tensor, sampling: Any, t0: float) -> dict[str, Tensor]:  # fmt: skip
    """This rank's gradient sums, KL sums and token count for its shard of one step; rank 0
    also contributes the elapsed time (so every rank stops at the same step)."""
    mine = shard(texts)
    state = {"weight": torch.zeros_like(lens.weight), "bias": torch.zeros_like(lens.bias)}
    state |= {"kl": torch.zeros(lens.n_layers, device=W.device), "n": torch.zeros(1)}
    state["t"] = torch.tensor([time.time() - t0 if dist_info().rank == 0 else 0.0])
    if mine:
        entries = list(range(lens.n_layers + 1))
        acts, _ = token_residuals(model, mine, entries, max_tokens=cfg["max_tokens"])
        grads, sums = _step_grads(model, lens, acts, W, cfg["chunk_rows"], sampling)
        state |= grads | {"kl": sums, "n": torch.tensor([float(acts.shape[1])])}
    return all_reduce_state(state)


def train_tuned_lens(
    model: Model,
    texts: Sequence[str],
    options: TrainingOptions | None = None,
    *,
    init: TunedLens | None = None,
) -> TunedLensTraining:
    """Train a tuned lens on ``texts`` (every real token of every text is a training token).

    Under ``torchrun`` every rank takes its shard of each step's texts and the same step, so
    every rank ends with the same lens (write it on rank 0 only).

    Args:
        texts: one language, or :func:`mix_texts` for a balanced mix.
        options: the settings (:class:`~mechlingo.analyses.decoders.options.TrainingOptions`;
            its defaults when ``None``):
        steps, max_seconds: the budget (at most this many steps; stop earlier when rank 0 has
            trained this long); the learning rate decays with whichever runs out first.
        texts_per_step: texts per step over all ranks (each cut to ``max_tokens`` tokens).
        lr: Adam's rate (warm-up over ``warmup`` steps, then linear decay), scaled per entry
            by ``min(1, KL_0 / median KL_0)`` (``KL_0``: the first step's KL of each entry).
        vocab_sample: ``None`` the exact objective (:func:`translator_kl`); an int ``m`` the
            sampled one (:func:`sampled_translator_kl`: each chunk's target
            top-``target_top_k`` tokens plus a remainder bucket estimated from ``m`` tokens);
            ``"auto"`` exact up to 32,768 tokens, else ``m = 4096``.
        chunk_rows: tokens per unembedding pass; seed: the text order and the samples;
        init: a lens to continue from (default the identity).

    Returns:
        A :class:`TunedLensTraining`; ``lens.meta`` records the settings and final loss.
    """
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if not texts:
        raise InputError("no training text for the tuned lens", fix="pass non-empty lines")
    o = TrainingOptions() if options is None else options
    steps, max_seconds, lr, warmup, seed = o.steps, o.max_seconds, o.lr, o.warmup, o.seed
    lens = init if init is not None else TunedLens.for_model(model)
    lens.check(model)
    world = dist_info().world_size
    opt = _Adam([lens.weight, lens.bias])
    W = model.W_U.detach().float()
    sampling = _sampling(model, o.vocab_sample, o.target_top_k, seed)
    cfg = {"steps": steps, "max_seconds": max_seconds, "texts_per_step": o.texts_per_step,
           "lr": lr, "warmup": warmup, "max_tokens": o.max_tokens, "chunk_rows": o.chunk_rows,
           "vocab_sample": sampling[1] if sampling else None, "target_top_k": o.target_top_k,
           "seed": seed, "n_texts": len(texts)}  # fmt: skip
    losses, counts, t0 = [], [], time.time()
    bar = tqdm(total=steps, desc="tuned lens", disable=not o.progress or dist_info().rank != 0)
    batches = _step_texts(texts, o.texts_per_step, seed)
    for step in range(steps):
        state = _rank_step(model, lens, next(batches), cfg, W, sampling, t0)
        n_tok, elapsed = float(state["n"]), float(state["t"])
        done = max((step + 1) / steps, elapsed / max_seconds if max_seconds else 0.0)
        lens.weight.grad = state["weight"] / n_tok
        lens.bias.grad = state["bias"] / n_tok
        losses.append((state["kl"] / n_tok).cpu())
        opt.step(lr * _lr_factor(step, max(1, warmup), done), losses[0])
        lens.weight.grad = lens.bias.grad = None
        counts.append(int(n_tok))
        bar.set_postfix(kl=f"{float(losses[-1].mean()):.3f}", refresh=False)
        bar.update()
        if max_seconds is not None and elapsed >= max_seconds:
            break
    bar.close()
    loss = torch.stack(losses)
    k = max(1, len(losses) // 10)
    lens.meta |= {"train": cfg, "steps_done": len(losses), "tokens": int(sum(counts)),
                  "world_size": world, "seconds": round(time.time() - t0, 1),
                  "final_train_loss": loss[-k:].mean(0).tolist()}  # fmt: skip
    return TunedLensTraining(lens, loss, counts, time.time() - t0, world, cfg)


# --------------------------------------------------------------------------------------
# Held-out divergence: how far each decoder's distribution is from the model's own
# --------------------------------------------------------------------------------------


def _sample_positions(rows: list[int], per_text: int | None, seed: int) -> list[int]:
    """Up to ``per_text`` token indices per text (seeded), all with ``None``."""
    by_text: dict[int, list[int]] = {}
    for t, r in enumerate(rows):
        by_text.setdefault(r, []).append(t)
    rng = random.Random(seed)
    keep: list[int] = []
    for r in sorted(by_text):
        toks = by_text[r]
        keep += toks if per_text is None or len(toks) <= per_text else rng.sample(toks, per_text)
    return sorted(keep)


def lens_divergence(
    model: Model,
    texts: Sequence[str],
    lenses: Mapping[str, TunedLens | None],
    *,
    max_tokens: int = 64,
    positions_per_text: int | None = 8,
    batch_size: int = HELDOUT_BATCH_SIZE,
    seed: int = SEED,
) -> dict[str, Any]:
    """Held-out ``KL(p_final || p_decoder)`` per lens entry for each decoder (``None`` = the
    logit lens), on the same tokens: the mean over texts of each text's mean KL, with a
    bootstrap 95% interval over texts (the texts are the independent units).

    Returns:
        ``{"entries", "n_texts", "n_tokens", "decoders": {name: {"kl", "lo", "hi"}}}``
        (lists over entries ``0..n-1``; the output entry is 0 for every decoder).
    """
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise InputError("no held-out text to measure the lens divergence on")
    for lens in lenses.values():
        if lens is not None:
            lens.check(model)
    n = site_map(model).n_layers
    entries = list(range(n + 1))
    W = model.W_U.detach().float()
    per_text = {name: torch.zeros(len(texts), n) for name in lenses}
    n_tok = torch.zeros(len(texts))
    for b0 in range(0, len(texts), batch_size):
        acts, rows = token_residuals(
            model, texts[b0 : b0 + batch_size], entries, max_tokens=max_tokens
        )
        keep = _sample_positions(rows, positions_per_text, seed + b0)
        acts, rows_t = acts[:, keep], torch.tensor([rows[k] + b0 for k in keep])
        target = _target_logp(model, acts[n], W)
        n_tok.index_add_(0, rows_t, torch.ones(len(keep)))
        with torch.no_grad():
            for name, lens in lenses.items():
                for e in range(n):
                    kl = translator_kl(model, lens, e, acts[e], target, W).cpu()
                    per_text[name][:, e].index_add_(0, rows_t, kl)
    ok = n_tok > 0
    out: dict[str, Any] = {"entries": entries[:-1], "n_texts": int(ok.sum())}
    out |= {"n_tokens": int(n_tok.sum()), "decoders": {}}
    for name, sums in per_text.items():
        means = (sums[ok] / n_tok[ok, None]).T  # [entry, text]
        cis = [bootstrap_mean(m.tolist(), seed=seed) for m in means]
        out["decoders"][name] = {"kl": [c.estimate for c in cis], "lo": [c.lo for c in cis],
                                 "hi": [c.hi for c in cis]}  # fmt: skip
    return out


# --------------------------------------------------------------------------------------
# The decoder registration
# --------------------------------------------------------------------------------------

#: Why the card has no tuned-lens row without a lens (measured on the embedded model).
NO_TUNED_LENS = (
    "no tuned lens given: one trained within the card's CPU budget is no decoder (on the "
    "embedded model 2 steps took 22 s and raised the mean KL to the output from 38.6 to 39.7 "
    "nats); train one with `mechlingo tuned-lens --out DIR` and pass the settings "
    '{"decoders": {"tuned_lens": "DIR"}}'
)


#: A tuned lens's cost to the card per prompt (every entry read), in its cost unit: taken as
#: the patchscope's measured 7.6 items scored under ``rank``, an upper bound.
CARD_COST = 7.6


def _check_folder(value: Any) -> None:
    """A lens given as a folder must hold a saved lens (checked before the model loads)."""
    if isinstance(value, (str, Path)) and not (Path(value) / _META_FILE).is_file():
        raise InputError(f"--tuned-lens {value} holds no tuned lens ({_META_FILE})",
                         where="--tuned-lens", fix="train one with `mechlingo tuned-lens --out DIR`")  # fmt: skip


def _tuned(model: Model, *, tuned_lens: TunedLens | str | Path | None = None,
           **opts: Any) -> TunedLens:  # fmt: skip
    assert tuned_lens is not None  # a required option: the registry refuses its absence
    if isinstance(tuned_lens, TunedLens):
        return tuned_lens
    return load_tuned_lens(tuned_lens, model)


def _register() -> None:
    lens = DecoderOption(
        "--tuned-lens", "tuned_lens", str, None,
        "folder of a lens from `mechlingo tuned-lens` (a TunedLens in Python), or "
        "NAME=DIR,NAME=DIR for several side by side (decoders tuned-NAME)",
        required=True, fix="train one with `mechlingo tuned-lens --out DIR`",
        missing=NO_TUNED_LENS, per_label=True, validate=_check_folder,
    )  # fmt: skip
    register_decoder(TUNED, _tuned, options=[lens], card_cost=CARD_COST,
                     help="a tuned lens's affine translator first (--tuned-lens)")  # fmt: skip


_register()

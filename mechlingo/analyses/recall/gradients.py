"""The gradient pass of attribution patching (:mod:`mechlingo.analyses.recall.attribution`):
one forward and one backward pass of the target batch that give, for every hook of a grid,
the target activations, the source activations at the grid positions and ``d readout / d
activation``; the interpolated copies of integrated gradients; and, for the QK fix, the
pattern gradients and the exact change of an attention pattern under a ``resid_pre`` patch.

Gradients are enabled locally (``torch.enable_grad()``) and never reach the model's
parameters (only activation gradients, with ``torch.autograd.grad``); every hook is removed
when a pass ends, also after an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.activations.runs import (
    StopForward,
    final_resid_name,
    hooked,
    model_input_device,
    run_batch,
)
from mechlingo.analyses.recall.patching import AnswerReadout, PatchingError
from mechlingo.analyses.recall.patching.grid import PatchingSetup
from mechlingo.analyses.recall.patching.readouts import PackedReadouts, evaluate_readouts
from mechlingo.analyses.recall.patching.runs import read_run, repeat_batch
from mechlingo.core.sites import edit_hooks, resolve_site
from mechlingo.core.tokens import TokenBatch, batch_context
from mechlingo.core.types import Model
from mechlingo.kernels.readout import apply_final_norm, unembed


def _readout_values(
    model: Model,
    final: Float[Tensor, "row d_model"],
    readouts: Sequence[AnswerReadout],
    packed: PackedReadouts,
) -> Float[Tensor, "readout row"]:
    """The readouts from final-residual rows, differentiably (final norm, unembedding,
    log-softmax; the same quantities :func:`mechlingo.kernels.readout.read_logits` reads)."""
    ids, _, slices = packed
    logits = unembed(model, apply_final_norm(model, final.to(model.W_U.device)))
    lse = torch.logsumexp(logits, dim=-1)
    ids = ids.to(logits.device)
    tok = torch.gather(
        logits.unsqueeze(1).expand(-1, ids.shape[1], -1), 2, ids.clamp_min(0)
    )  # [row, track, member]
    tok = tok.masked_fill(ids < 0, float("-inf"))
    set_lp = torch.logsumexp(tok, dim=-1) - lse[:, None]
    return torch.stack([m.combine(set_lp[:, s]) for m, s in zip(readouts, slices, strict=True)])


@dataclass
class Grads:
    src_acts: dict[str, Tensor]  # hook -> [row, position, ...] source at the grid positions
    acts: dict[str, Tensor]  # hook -> [row, pos, ...] target activations (detached, float)
    grads: dict[str, Tensor]  # hook -> [readout, row, pos, ...] d readout / d activation
    clean: Tensor  # [readout, row]
    corrupted: Tensor  # [readout, row]
    pattern_grads: dict[int, Tensor]  # layer -> [readout, row, head, q, k]
    qk_grads: dict[int, Tensor]  # layer -> [readout, row, pos, d_model] QK path of resid_pre


@dataclass
class _Probed:
    """A forward pass of the target with a zero *probe* added to each hook's output."""

    acts: dict[str, Tensor]  # first firing's activation (detached, float)
    probes: dict[str, list[Tensor]]  # the probes of each hook, one per firing
    used: dict[str, Tensor]  # the hook's output as the model goes on to use it
    final: Tensor  # [row, d_model] final residual at each last real token (in the graph)


def _probed_forward(
    model: Model,
    tgt: TokenBatch,
    wanted: Sequence[str],
    first: Sequence[tuple[str, Callable]] = (),
) -> _Probed:
    """Run ``tgt`` (under ``torch.enable_grad()``) with a zero probe added at every hook of
    ``wanted``, and stop at the final residual stream. ``d readout / d probe`` is the
    derivative with respect to *replacing* the hook's output, which is what patching does (a
    bridge hook point may feed only one of the paths that read the tensor, e.g. resid_mid is
    the input of the MLP's norm). ``first``: hooks registered before the probes (the input
    interpolation of integrated gradients)."""
    p = _Probed({}, {}, {}, torch.empty(0))
    out: dict[str, Tensor] = {}
    last, rows = tgt.last_index, torch.arange(tgt.batch_size)

    def keep(name: str) -> Callable:
        def hook(t: Tensor, hook: Any) -> Tensor:
            probe = torch.zeros_like(t).requires_grad_(True)
            p.probes.setdefault(name, []).append(probe)
            p.acts.setdefault(name, t.detach().float())
            p.used[name] = t + probe
            return p.used[name]

        return hook

    def final_hook(t: Tensor, hook: Any) -> None:
        out["final"] = t[rows.to(t.device), last.to(t.device)]
        raise StopForward

    # a probe at a bridge's resid_mid must reach the residual too, as a patch there does
    fwd_hooks = [*first, *(h for n in wanted for h in edit_hooks(model, n, keep(n)))]
    fwd_hooks.append((final_resid_name(model), final_hook))
    b = tgt.to(model_input_device(model))
    with batch_context(b), hooked(model, fwd_hooks):
        try:
            model(b.tokens, attention_mask=b.attention_mask())
        except StopForward:
            pass
    if "final" not in out:
        raise RuntimeError(f"hook {final_resid_name(model)} did not fire")
    silent = [n for n in wanted if n not in p.probes]
    if silent:
        raise RuntimeError(f"hooks {silent[:3]} did not fire during the forward pass")
    p.final = out["final"]
    return p


def _readout_grads(values: Tensor, targets: Sequence[Tensor]) -> list[list[Tensor]]:
    """``[readout][target]``: the gradient of each readout (summed over rows: rows are
    independent) with respect to each target tensor; zeros where it does not depend on it."""
    per: list[list[Tensor]] = []
    for m in range(values.shape[0]):  # one backward pass per readout
        gs = torch.autograd.grad(values[m].sum(), targets, retain_graph=True, allow_unused=True)
        per.append(
            [
                torch.zeros_like(t) if x is None else x.detach()
                for x, t in zip(gs, targets, strict=True)
            ]
        )
    return per


def _qk_path_grads(
    p: _Probed,
    per: Sequence[Sequence[Tensor]],
    k: int,
    pre: Mapping[int, str],
    pat: Mapping[int, str],
) -> tuple[dict[int, Tensor], dict[int, Tensor]]:
    """For each layer of ``pat`` (whose pattern probes are targets ``k, k + 1, ...`` of
    ``per``): the pattern gradient, and the part of ``d readout / d resid_pre`` that goes
    through that layer's attention pattern."""
    pattern_grads: dict[int, Tensor] = {}
    qk_grads: dict[int, Tensor] = {}
    for j, layer in enumerate(pat):
        pattern_grads[layer] = torch.stack([gs[k + j] for gs in per]).float()
        qk = []
        for gs in per:
            (g_qk,) = torch.autograd.grad(
                p.used[pat[layer]],
                p.probes[pre[layer]][0],
                grad_outputs=gs[k + j],
                retain_graph=True,
                allow_unused=True,
            )
            qk.append(torch.zeros_like(p.acts[pre[layer]]) if g_qk is None else g_qk.float())
        qk_grads[layer] = torch.stack(qk)
    return pattern_grads, qk_grads


EMBED_HOOK = "hook_embed"  # the token embeddings: where integrated gradients interpolate


def _interpolation_hook(
    src_embed: Float[Tensor, "row pos d_model"], alphas: Sequence[float]
) -> tuple[str, Callable]:
    """The hook that moves the embeddings of copy ``j`` of the target (rows ``j * B`` to
    ``(j + 1) * B``) to ``target + alphas[j] * (source - target)``."""
    a = torch.tensor([float(x) for x in alphas]).repeat_interleave(src_embed.shape[0])

    def hook(t: Tensor, hook: Any) -> Tensor:
        s = src_embed.to(device=t.device, dtype=t.dtype).repeat(len(alphas), 1, 1)
        return t + a.to(device=t.device, dtype=t.dtype)[:, None, None] * (s - t)

    return EMBED_HOOK, hook


def check_interpolable(model: Model, src: TokenBatch, tgt: TokenBatch) -> None:
    """Integrated gradients interpolate the input embeddings position by position: the
    source and target rows must have the same token lengths."""
    if EMBED_HOOK not in model.hook_dict:
        raise PatchingError(
            f"method='ig' interpolates the embeddings at {EMBED_HOOK!r}, which this model lacks; "
            "use method='atp'"
        )
    if src.tokens.shape != tgt.tokens.shape or not torch.equal(src.lengths, tgt.lengths):
        raise PatchingError(
            "method='ig' interpolates the input embeddings between source and target position "
            "by position, so each source row needs its target row's token length (got lengths "
            f"{src.lengths.tolist()} and {tgt.lengths.tolist()}); pair prompts of equal "
            "length or use method='atp'"
        )


def gradient_pass(
    model: Model,
    setup: PatchingSetup,
    hook_names: Sequence[str],
    qk_layers: Sequence[int] = (),
    alphas: Sequence[float] = (0.0,),
) -> Grads:
    """The source run without gradients (its activations at the grid positions and the clean
    readouts, read as :func:`~mechlingo.analyses.recall.patching.patch_activations` reads them), then one
    forward of the target rows with gradients on and one ``autograd.grad`` per readout: the
    gradient of each row's readout with respect to every requested activation (rows are
    independent, so the gradient of the sum is each row's own gradient).

    ``alphas`` (integrated gradients): the target runs once per ``alpha`` in the same batch,
    its embeddings moved to ``target + alpha (source - target)``, and the gradients are the
    mean over the copies; ``alphas[0]`` must be 0 (the target run itself: its activations
    and the corrupted readout come from that copy). ``setup``: the resolved grid (its batches,
    source positions and readouts); ``hook_names``: the hooks to differentiate."""
    src, tgt, src_pos = setup.src, setup.tgt, setup.pos.source.T
    readouts, packed = setup.readouts, setup.packed
    names = list(dict.fromkeys(hook_names))
    pre = {layer: resolve_site(model, "resid_pre", layer).hook_name for layer in qk_layers}
    pat = {layer: f"blocks.{layer}.attn.hook_pattern" for layer in qk_layers}
    missing = [n for n in [*names, *pat.values()] if n not in model.hook_dict]
    if missing:
        raise PatchingError(f"hooks not in this model: {missing[:3]}")
    k, B = len(alphas), tgt.batch_size
    reads = {n: src_pos.contiguous() for n in names}
    if k > 1:  # the source embeddings at every position, for the interpolation
        reads[EMBED_HOOK] = torch.arange(src.tokens.shape[1]).repeat(B, 1)
    src_acts, src_final = read_run(model, src, reads)
    first = [_interpolation_hook(src_acts.pop(EMBED_HOOK), alphas)] if k > 1 else []
    big = repeat_batch(tgt, k) if k > 1 else tgt
    clean = evaluate_readouts(model, src_final, readouts, packed, torch.arange(B)).float().cpu()
    rows_packed = _repeat_packed(packed, k)
    with torch.enable_grad():
        wanted = list(dict.fromkeys([*names, *pre.values(), *pat.values()]))
        p = _probed_forward(model, big, wanted, first)
        values = _readout_values(model, p.final, readouts, rows_packed)  # [readout, k * row]
        targets = [t for n in names for t in p.probes[n]]
        targets += [p.probes[pat[layer]][0] for layer in qk_layers]
        per = _readout_grads(values, targets)
        grads: dict[str, Tensor] = {}
        j = 0
        for n in names:  # a hook firing twice: the sum over its firings; then the mean over
            g = torch.stack([sum(gs[j : j + len(p.probes[n])]) for gs in per]).float()
            grads[n] = g.view(g.shape[0], k, B, *g.shape[2:]).mean(1)  # the interpolation
            j += len(p.probes[n])
        pattern_grads, qk_grads = _qk_path_grads(p, per, j, pre, pat)
    return Grads(
        src_acts=src_acts,
        acts={n: p.acts[n][:B] for n in names},
        grads=grads,
        clean=clean,
        corrupted=values.detach().float().cpu()[:, :B],
        pattern_grads=pattern_grads,
        qk_grads=qk_grads,
    )


def _repeat_packed(packed: PackedReadouts, copies: int) -> PackedReadouts:
    """The readouts' packed token sets for ``copies`` copies of the batch, one after another."""
    ids, primary, slices = packed
    if copies == 1:
        return packed
    return ids.repeat(copies, 1, 1), primary.repeat(copies, 1), slices


def patched_patterns(
    model: Model,
    one: TokenBatch,
    layers: Sequence[int],
    positions: Int[Tensor, " position"],
    values: Mapping[int, Float[Tensor, "position d_model"]],
) -> dict[int, Float[Tensor, "position head q k"]]:
    """For one unpadded example: the change of layer ``l``'s attention pattern when its
    ``resid_pre`` at ``positions[j]`` is set to ``values[l][j]``, for every ``j``. One pass:
    at each layer's block input the batch grows by one patched copy per position, the copies
    run that layer's attention, their patterns are read, and they are dropped again at the
    layer's ``hook_resid_mid`` (the MLP input) and ``hook_resid_post`` (the stream), so the
    pass costs one forward plus one attention layer per copy."""
    P = int(positions.shape[0])
    out: dict[int, Tensor] = {}
    fwd_hooks: list[tuple[str, Callable]] = []

    def grow(layer: int) -> Callable:
        def hook(t: Tensor, hook: Any) -> Tensor:
            big = torch.cat([t, t[:1].expand(P, *t.shape[1:])]).clone()
            v = values[layer].to(device=t.device, dtype=t.dtype)
            big[torch.arange(1, P + 1, device=t.device), positions.to(t.device)] = v
            return big

        return hook

    def read(layer: int) -> Callable:
        def hook(t: Tensor, hook: Any) -> None:
            out[layer] = (t[1:] - t[:1]).detach().float()

        return hook

    def shrink(t: Tensor, hook: Any) -> Tensor:
        return t[:1]

    def stop(t: Tensor, hook: Any) -> None:
        raise StopForward

    for layer in layers:
        fwd_hooks.append((resolve_site(model, "resid_pre", layer).hook_name, grow(layer)))
        fwd_hooks.append((f"blocks.{layer}.attn.hook_pattern", read(layer)))
        # drop the copies: resid_mid feeds only the MLP's norm on a bridge (the MLP then runs
        # one row), resid_post is the residual stream itself
        fwd_hooks.append((resolve_site(model, "resid_mid", layer).hook_name, shrink))
        fwd_hooks.append((resolve_site(model, "resid_post", layer).hook_name, shrink))
    fwd_hooks.append((resolve_site(model, "resid_mid", max(layers)).hook_name, stop))
    try:
        run_batch(model, one, fwd_hooks)
    except RuntimeError as e:
        raise PatchingError(
            f"the QK fix's pass (a batch grown and shrunk mid-pass) failed ({e}); use "
            "attribution_patch(..., qk_fix=False) for this model"
        ) from e
    missing = [layer for layer in layers if layer not in out]
    if missing:
        raise RuntimeError(f"attention patterns of layers {missing} were not read")
    return out

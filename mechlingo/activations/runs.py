"""Forward passes that read only what they need.

* :func:`collect` runs a padded batch and keeps, for each requested hook, only the rows at the
  requested positions (usually each prompt's last real token), stopping the pass after the
  last requested hook, so the full-sequence unembedding is never paid for;
* :func:`next_token_logits` -- the next-token logits at each row's last real token;
* :func:`last_token_means` -- the mean activation at each prompt's last real token for every
  layer at once, streamed into a float64 running sum
  (:class:`mechlingo.kernels.streaming.StreamingMean`): memory independent of the number of
  prompts, and under ``torchrun`` each rank's sums all-reduced
  (:mod:`mechlingo.core.distributed`).

They set the current :class:`~mechlingo.core.tokens.TokenBatch`
(:func:`mechlingo.core.tokens.batch_context`), so interventions know each row's last token,
and remove every hook they add, also on error; hooks are one thread's at a time (:func:`hooked`)."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.core.defaults import BATCH_SIZE, PROGRESS
from mechlingo.core.distributed import all_reduce_state, shard
from mechlingo.core.errors import InputError, InterventionError
from mechlingo.core.sites import SiteError, carries_first, resolve_layers, resolve_site
from mechlingo.core.tokens import TokenBatch, batch_context, encode, sorted_batches
from mechlingo.core.types import FwdHooks, HookFn, Model
from mechlingo.kernels.readout import final_logits
from mechlingo.kernels.streaming import StreamingMean


class StopForward(Exception):
    """Raised inside a hook to end a forward pass early once everything needed is read."""


def model_input_device(model: Model) -> torch.device:
    """The device token ids go to (the model's configured device, else the unembedding's)."""
    cfg_dev = getattr(model.cfg, "device", None)
    if cfg_dev is not None:
        return torch.device(cfg_dev)
    return model.W_U.device


#: the threads running hooked passes on each model: model -> {thread ident: [depth, hooks]}
_USERS: weakref.WeakKeyDictionary[Any, dict[int, list[int]]] = weakref.WeakKeyDictionary()
_USERS_GUARD = threading.Lock()


@contextlib.contextmanager
def hooked(model: Model, fwd_hooks: FwdHooks) -> Iterator[Any]:
    """``model.hooks(fwd_hooks=...)`` (every :class:`~mechlingo.core.types.Model` has it): the
    hooks are removed when the block exits, also after an exception.

    One thread at a time may have hooks on a model: hooks while another thread is inside
    ``hooked`` on the same model, or a pass (no hooks) while another thread's hooks are on,
    raise an :class:`~mechlingo.core.errors.InterventionError` before anything is attached
    (TransformerLens hooks are global to the model, and its ``hooks()`` contexts unwind by a
    level counter the threads would share). The hooks added act only on forward passes of
    the thread that added them (a plain ``model(...)`` call of another thread is left alone).
    Nested blocks in one thread work as before."""
    me = threading.get_ident()
    hooks = carries_first(list(fwd_hooks))
    _enter(model, me, bool(hooks))
    try:
        with model.hooks(fwd_hooks=[(name, _this_thread(fn, me)) for name, fn in hooks]):
            yield model
    finally:
        _leave(model, me, bool(hooks))


def _enter(model: Model, me: int, with_hooks: bool) -> None:
    """Record this thread as a user of ``model`` (with hooks or not), or refuse."""
    with _USERS_GUARD:
        try:
            users = _USERS.setdefault(model, {})
        except TypeError:  # a model object without weak references: not tracked
            return
        alive = {t.ident for t in threading.enumerate()}
        for ident in [i for i in users if i not in alive]:  # threads that died inside
            del users[ident]
        others = [i for i, (_, hooks) in users.items() if i != me and (hooks or with_hooks)]
        if others:
            names = {t.ident: t.name for t in threading.enumerate()}
            raise InterventionError(
                f"another thread ({names.get(others[0], others[0])!r}) has hooks on this "
                f"model, or is running it, right now; TransformerLens hooks belong to the "
                "model, so each thread's forward passes would run the other's hooks too",
                fix="give each thread its own model (copy.deepcopy(model)), or run the "
                "interventions one after the other",
            )
        depth_hooks = users.setdefault(me, [0, 0])
        depth_hooks[0] += 1
        depth_hooks[1] += int(with_hooks)


def _leave(model: Model, me: int, with_hooks: bool) -> None:
    with _USERS_GUARD:
        try:
            users = _USERS.get(model, {})
        except TypeError:
            return
        mine = users.get(me)
        if mine is None:
            return
        mine[0] -= 1
        mine[1] -= int(with_hooks)
        if mine[0] <= 0:
            del users[me]


def _this_thread(fn: HookFn, me: int) -> HookFn:
    """``fn`` acting only in the thread ``me`` (elsewhere: the activation left as it is)."""

    def hook(t: Tensor, hook: Any) -> Tensor | None:
        if threading.get_ident() != me:
            return None
        return fn(t, hook)

    return hook


def run_batch(model: Model, batch: TokenBatch, fwd_hooks: FwdHooks = ()) -> Any:
    """Run the model on a right-padded batch with an attention mask and the given hooks.
    Returns whatever the model returns (logits), or ``None`` when a hook stopped the run.

    The pass runs under ``torch.no_grad()``: mechlingo reads and edits activations, it never
    differentiates through them, and an autograd graph would only cost time and memory (the
    models' parameters require gradients by default)."""
    dev = model_input_device(model)
    b = batch.to(dev)
    with torch.no_grad(), batch_context(b), hooked(model, fwd_hooks):
        try:
            return model(b.tokens, attention_mask=b.attention_mask())
        except StopForward:
            return None


def collect(
    model: Model,
    batch: TokenBatch,
    hook_names: Sequence[str],
    *,
    positions: Int[Tensor, " batch"] | None = None,
    fwd_hooks: FwdHooks = (),
    stop_early: bool = True,
) -> dict[str, Float[Tensor, "batch ..."]]:
    """Read the activations of ``hook_names`` at one position per row.

    Args:
        model: the model.
        batch: a right-padded batch.
        hook_names: TransformerLens hook names (use :mod:`mechlingo.core.sites` to build them).
        positions: per row, the position to read; default each row's last real token.
        fwd_hooks: (name, fn) hook pairs to run as well (e.g. an intervention's), added
            *before* the reading hooks so that what is read includes their effect at the same
            hook point.
        stop_early: stop the forward pass after the last reading hook fires.

    Returns:
        ``{hook_name: tensor[batch, ...]}`` (float32, on the hook's device).
    """
    names = list(dict.fromkeys(hook_names))
    if not names:
        raise InputError("no hooks to read")
    missing = [n for n in names if n not in model.hook_dict]
    if missing:
        raise SiteError(f"hooks not in this model: {missing}")
    pos = batch.last_index if positions is None else positions
    out: dict[str, Tensor] = {}
    remaining = set(names)
    rows = torch.arange(batch.batch_size)

    def make(name: str) -> HookFn:
        def hook(t: Tensor, hook: Any) -> None:
            idx = pos.to(t.device)
            out[name] = t[rows.to(t.device), idx].detach().float()
            remaining.discard(name)
            if stop_early and not remaining:
                raise StopForward

        return hook

    fwd_hooks = list(fwd_hooks) + [(n, make(n)) for n in names]
    run_batch(model, batch, fwd_hooks)
    if remaining:
        raise RuntimeError(f"hooks {sorted(remaining)} did not fire during the forward pass")
    return out


def final_resid_name(model: Model) -> str:
    return f"blocks.{int(model.cfg.n_layers) - 1}.hook_resid_post"


def next_token_logits(
    model: Model,
    batch: TokenBatch,
    *,
    fwd_hooks: FwdHooks = (),
) -> Float[Tensor, "batch vocab"]:
    """The model's next-token logits after each row's last real token (float32).

    Computed from the final residual stream of that position only (final norm + unembedding),
    which equals the model's own output there.
    """
    name = final_resid_name(model)
    resid = collect(model, batch, [name], fwd_hooks=fwd_hooks)[name]
    return final_logits(model, resid)


# --------------------------------------------------------------------------------------
# Streaming means of last-token activations (see the module docstring)
# --------------------------------------------------------------------------------------


@dataclass
class LayerMeans:
    """Mean last-token activation per layer over a prompt set.

    Attributes:
        mean: ``[n_layers_read, width]`` float64, row ``i`` for ``layers[i]``.
        layers: the layers read.
        site: the site read (``resid_pre`` by default).
        count: number of prompts averaged.
        norm: ``[n_layers_read]`` float64 on the CPU, the mean L2 norm of the same
            activations (``None`` unless asked for: ``last_token_means(..., norms=True)``).
    """

    mean: Float[Tensor, "layer width"]
    layers: list[int]
    site: str
    count: int
    norm: Float[Tensor, " layer"] | None = None

    def __sub__(self, other: LayerMeans) -> Float[Tensor, "layer width"]:
        if self.layers != other.layers or self.site != other.site:
            raise InputError(
                f"cannot subtract means of different layers/sites ({self.site} {self.layers} vs "
                f"{other.site} {other.layers})"
            )
        return self.mean - other.mean.to(self.mean.device)


def last_token_means(
    model: Model,
    prompts: Sequence[str],
    *,
    site: str = "resid_pre",
    layers: Any = None,
    batch_size: int = BATCH_SIZE,
    fwd_hooks: FwdHooks = (),
    progress: bool = PROGRESS,
    norms: bool = False,
) -> LayerMeans:
    """Mean activation at each prompt's last token, for every layer in one pass per batch.

    Args:
        model: the model.
        prompts: the prompt set (any length; memory does not grow with it).
        site: a site with one vector per position (``resid_pre``, ``resid_post``,
            ``mlp_post``, ...).
        layers: layers to read (default all).
        batch_size: prompts per forward pass (grouped by length to keep padding small).
        fwd_hooks: (name, fn) hook pairs applied during the runs (e.g. an intervention's).
        norms: also the mean L2 norm of the same activations per layer, read in the same
            passes (``LayerMeans.norm``: the scale of the residual stream a steering vector
            is added to).

    Returns:
        :class:`LayerMeans` with a float64 ``[n_layers, width]`` mean.
    """

    prompts = list(prompts)
    if not prompts:
        raise InputError("no prompts to average over")
    layer_list = resolve_layers(model, layers)
    sites = [resolve_site(model, site, layer) for layer in layer_list]
    if sites[0].width <= 0:
        raise SiteError(f"site {site!r} has no single vector per position; use e.g. resid_pre")
    names = [s.hook_name for s in sites]
    dev = model.W_U.device
    acc = StreamingMean(shape=(len(layer_list), sites[0].width), device=dev)
    norm_sum = torch.zeros(len(layer_list), dtype=torch.float64)
    mine = shard(prompts)  # all prompts in a single process; this rank's part under torchrun
    if mine:
        batch = encode(model, mine)
        groups = sorted_batches(batch.lengths, batch_size)
        for rows in tqdm(groups, desc="means", disable=not progress):
            acts = collect(model, batch.select(rows), names, fwd_hooks=fwd_hooks)
            acc.update(torch.stack([acts[n].to(dev) for n in names], dim=1))
            if norms:
                norm_sum += torch.stack([acts[n].double().norm(dim=-1).sum(0).cpu() for n in names])
    total = StreamingMean.from_state(all_reduce_state(acc.state_dict()))
    norm = all_reduce_state({"sum": norm_sum})["sum"] / len(prompts) if norms else None
    return LayerMeans(total.mean, layer_list, sites[0].name, len(prompts), norm)

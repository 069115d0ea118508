"""Streaming means of last-token activations for every layer at once.

:func:`last_token_means` runs each batch of prompts once, reads the activation at each
prompt's last real token for all requested layers in the same forward pass (stopping the pass
after the last layer read, so the unembedding is never paid for), and adds them to a float64
running sum (:class:`mechlingo.kernels.streaming.StreamingMean`). Memory is independent of the
number of prompts: one ``[n_layers, width]`` float64 sum. Device-agnostic: the sum lives on
the device of the unembedding. Launched under ``torchrun`` (see
:mod:`mechlingo.activations.distributed`), each rank streams its shard of the prompts and the
sums are all-reduced, so every rank gets the mean over all prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.distributed import all_reduce_state, shard
from mechlingo.activations.runs import collect
from mechlingo.core.errors import InputError
from mechlingo.core.sites import SiteError, resolve_layers, resolve_site
from mechlingo.core.tokens import encode, sorted_batches
from mechlingo.core.types import FwdHooks, Model
from mechlingo.kernels.streaming import StreamingMean

__all__ = ["LayerMeans", "last_token_means"]


@dataclass
class LayerMeans:
    """Mean last-token activation per layer over a prompt set.

    Attributes:
        mean: ``[n_layers_read, width]`` float64, row ``i`` for ``layers[i]``.
        layers: the layers read.
        site: the site read (``resid_pre`` by default).
        count: number of prompts averaged.
    """

    mean: Float[Tensor, "layer width"]
    layers: list[int]
    site: str
    count: int

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
    batch_size: int = 16,
    fwd_hooks: FwdHooks = (),
    progress: bool = False,
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
    mine = shard(prompts)  # all prompts in a single process; this rank's part under torchrun
    if mine:
        batch = encode(model, mine)
        groups = sorted_batches(batch.lengths, batch_size)
        for rows in tqdm(groups, desc="means", disable=not progress):
            acts = collect(model, batch.select(rows), names, fwd_hooks=fwd_hooks)
            acc.update(torch.stack([acts[n].to(dev) for n in names], dim=1))
    total = StreamingMean.from_state(all_reduce_state(acc.state_dict()))
    return LayerMeans(total.mean, layer_list, sites[0].name, len(prompts))

"""The patched passes of activation patching: two strategies that give the same numbers.

Many patched copies of the target share one forward pass, each copy carrying the patch of one
cell. :func:`grown_passes` (``batching="grow"``) starts each pass as the unpatched target
alone and, at each layer's block input, grows the batch by one copy per cell of that layer, so
a copy patched at layer ``l`` computes only layers ``l`` and above (about half the work of
running every copy whole). :func:`stacked_passes` (``batching="stack"``) runs every copy
through the whole model, for models that cannot grow a batch mid-pass. :func:`writer` and
:func:`brancher` make the hooks; a :class:`PassPlan` carries the factories to use, so
:func:`mechlingo.analyses.recall.patching.patch_activations` can hand in the ones its package
exposes (tests replace them there to inject failures)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.prefix import (
    PrefixRecord,
    cache_grower,
    cache_upto,
    record_prefix,
    run_on_cache,
)
from mechlingo.activations.runs import StopForward, final_resid_name, run_batch
from mechlingo.analyses.recall.patching.errors import PatchingError
from mechlingo.analyses.recall.patching.readouts import (
    AnswerReadout,
    PackedReadouts,
    evaluate_readouts,
)
from mechlingo.analyses.recall.patching.result import Cell
from mechlingo.analyses.recall.patching.runs import read_run, repeat_batch, site_hook
from mechlingo.core.defaults import PROGRESS
from mechlingo.core.sites import edit_hooks
from mechlingo.core.tokens import TokenBatch
from mechlingo.core.types import Model

__all__ = [
    "PASS_COST_POSITIONS",
    "PassPlan",
    "brancher",
    "grown_passes",
    "prefix_parts",
    "shared_prefix_passes",
    "stacked_passes",
    "writer",
]

Hook = tuple[str, Callable]


def writer(rows: Tensor, positions: Tensor, heads: Tensor, values: Tensor, per_head: bool):
    """A hook writing ``values`` at ``(rows, positions[, heads])`` of the activation."""
    cache: dict[torch.device, tuple[Tensor, ...]] = {}

    def hook(t: Tensor, hook: Any) -> Tensor:
        if t.device not in cache:
            cache[t.device] = (
                rows.to(t.device),
                positions.to(t.device),
                heads.to(t.device),
                values.to(t.device),
            )
        r, p, h, v = cache[t.device]
        t = t.clone()
        if per_head:
            t[r, p, h] = v.to(t.dtype)
        else:
            t[r, p] = v.to(t.dtype)
        return t

    return hook


def brancher(rows: Tensor) -> Callable:
    """A hook appending copies of the batch rows ``rows`` (unpatched runs) to the batch, in
    that order."""
    cache: dict[torch.device, Tensor] = {}

    def hook(t: Tensor, hook: Any) -> Tensor:
        if t.device not in cache:
            cache[t.device] = rows.to(t.device)
        return torch.cat([t, t[cache[t.device]]])

    return hook


class PassPlan(NamedTuple):
    """What a batching strategy needs: the target batch, the cells in result order, each
    (site, layer)'s hook name, the source activations read at the grid positions, the target
    positions ``[label, row]``, the readouts and their packed token sets, the cells per pass,
    and the hook factories (:func:`writer`, :func:`brancher`). Each strategy returns
    ``values [readout, cell, row]`` and ``corrupted [readout, row]``."""

    model: Model
    tgt: TokenBatch
    cells: Sequence[Cell]
    names: Mapping[tuple[str, int], str]
    src_acts: Mapping[str, Tensor]
    tgt_pos: Tensor
    readouts: Sequence[AnswerReadout]
    packed: PackedReadouts
    cells_per_batch: int
    writer: Callable[..., Callable]
    brancher: Callable[[Tensor], Callable]
    progress: bool = PROGRESS

    def groups(self, n: int) -> Any:
        """The start of each group of ``cells_per_batch`` cells, under a progress bar
        (``tqdm.auto``: a widget in Jupyter) when ``progress``."""
        starts = range(0, n, self.cells_per_batch)
        return tqdm(starts, desc="patching", unit="group", disable=not self.progress)


def _cell_values(
    cells: Sequence[Cell], name: str, src_acts: Mapping[str, Tensor], example: Tensor
) -> Tensor:
    """The source activation each cell writes, for the given example of each cell:
    ``[n, width]`` (whole site) or ``[n, d_head]`` (one head)."""
    p_idx = torch.tensor([c.position for c in cells])
    vals = src_acts[name][example, p_idx]  # [n, width] or [n, head, d_head]
    if cells[0].site == "head":
        vals = vals[torch.arange(len(cells)), torch.tensor([c.head for c in cells])]
    return vals


def _cell_writer(
    plan: PassPlan, name: str, sel: Sequence[Cell], rows: Tensor, example: Tensor, shift: int = 0
) -> list[Hook]:
    """The hooks at ``name`` writing cell ``sel[i]`` (of example ``example[i]``) into batch row
    ``rows[i]`` (two at a bridge's resid_mid: see :func:`mechlingo.core.sites.edit_hooks`);
    a pass that starts at position ``shift`` holds position ``q`` in column ``q - shift``."""
    t_pos = plan.tgt_pos[torch.tensor([c.position for c in sel]), example] - shift
    head = torch.tensor([c.head for c in sel])
    vals = _cell_values(sel, name, plan.src_acts, example)
    return edit_hooks(plan.model, name, plan.writer(rows, t_pos, head, vals, sel[0].site == "head"))


def stacked_passes(plan: PassPlan) -> tuple[Tensor, Tensor]:
    """Every patched copy of every example runs the whole model: ``cells_per_batch`` copies of
    the whole target batch per pass (copy ``j`` carries cell ``j``), plus one unpatched copy
    in the first pass (the corrupted baseline)."""
    model, tgt, cells, readouts = plan.model, plan.tgt, plan.cells, plan.readouts
    B = tgt.batch_size
    rows = torch.arange(B)
    values = torch.empty(len(readouts), len(cells), B)
    corrupted = torch.empty(len(readouts), B)
    for start in plan.groups(len(cells)):
        chunk = cells[start : start + plan.cells_per_batch]
        by_hook: dict[str, list[tuple[int, Cell]]] = {}
        for j, cell in enumerate(chunk):
            by_hook.setdefault(plan.names[(cell.site, cell.layer)], []).append((j, cell))
        fwd_hooks = []
        for name, items in by_hook.items():
            copy = torch.tensor([j for j, _ in items]).repeat_interleave(B)
            row = rows.repeat(len(items))
            rep = [c for _, c in items for _ in range(B)]
            fwd_hooks.extend(_cell_writer(plan, name, rep, copy * B + row, row))
        extra = 1 if start == 0 else 0
        big = repeat_batch(tgt, len(chunk) + extra)
        _, final = read_run(model, big, {}, fwd_hooks=fwd_hooks)
        ex = rows.repeat(len(chunk) + extra)
        v = evaluate_readouts(model, final, readouts, plan.packed, ex)
        v = rearrange(v, "readout (cell ex) -> readout cell ex", ex=B).cpu()  # rows: cell-major
        if extra:
            corrupted = v[:, -1]
        values[:, start : start + len(chunk)] = v[:, : len(chunk)]
    return values, corrupted


def _grown_hooks(
    plan: PassPlan, group: Sequence[int], b: int, branch: Mapping[int, str]
) -> tuple[list[Hook], list[int]]:
    """The hooks of one grown pass of example ``b`` over the cells ``group`` (indices into
    ``plan.cells``), and the batch row of each of those cells. Row 0 stays unpatched; each
    layer's copies are appended at its block input ``branch[layer]``, in layer order."""
    cells = plan.cells
    new_rows: dict[int, int] = {}
    row_of: dict[int, int] = {}
    by_hook: dict[str, list[int]] = {}
    for i in group:
        row_of[i] = 1 + len(row_of)
        new_rows[cells[i].layer] = new_rows.get(cells[i].layer, 0) + 1
        by_hook.setdefault(plan.names[(cells[i].site, cells[i].layer)], []).append(i)
    # before the writers: at a shared hook point the copies must exist first
    fwd_hooks: list[Hook] = [
        (branch[layer], plan.brancher(torch.zeros(n, dtype=torch.long)))
        for layer, n in sorted(new_rows.items())
    ]
    for name, idx in by_hook.items():
        rows = torch.tensor([row_of[i] for i in idx])
        fwd_hooks.extend(
            _cell_writer(plan, name, [cells[i] for i in idx], rows, torch.full_like(rows, b))
        )
    return fwd_hooks, [row_of[i] for i in group]


def grown_passes(plan: PassPlan) -> tuple[Tensor, Tensor]:
    """One pass per example and group of ``cells_per_batch`` cells (in layer order). The pass
    starts with the unpatched target alone (row 0, which stays unpatched: the corrupted
    baseline); at the block input ``blocks.{l}.hook_resid_pre`` of each layer ``l`` with
    cells, copies of row 0 are appended, one per cell of that layer, and the cells' hooks
    write into their own rows. So the shared computation below layer ``l`` is done once."""
    model, tgt, cells, readouts = plan.model, plan.tgt, plan.cells, plan.readouts
    B = tgt.batch_size
    values = torch.empty(len(readouts), len(cells), B)
    corrupted = torch.empty(len(readouts), B)
    order = sorted(range(len(cells)), key=lambda i: cells[i].layer)  # stable
    branch = {layer: site_hook(model, "resid_pre", layer) for layer in {c.layer for c in cells}}
    for g, start in enumerate(plan.groups(len(order))):
        group = order[start : start + plan.cells_per_batch]
        finals = []
        for b in range(B):
            fwd_hooks, rows = _grown_hooks(plan, group, b, branch)
            finals.append(_grown_final(model, tgt.select([b]), fwd_hooks, 1 + len(group)))
        # one readout for the whole group: the unembedding streams W_U once, not per example
        ex = torch.arange(B).repeat_interleave(1 + len(group))
        v = evaluate_readouts(model, torch.cat(finals), readouts, plan.packed, ex)
        v = rearrange(v.cpu(), "readout (ex run) -> readout ex run", ex=B)  # example-major
        if g == 0:
            corrupted = v[:, :, 0]
        values[:, group] = rearrange(v[:, :, rows], "readout ex cell -> readout cell ex")
    return values, corrupted


def _grown_final(
    model: Model, one: TokenBatch, fwd_hooks: Sequence[Hook], expect_rows: int
) -> Float[Tensor, "row d_model"]:
    """Run the one-row batch ``one`` with the growing hooks; the final residual stream of
    every row of the grown batch at the example's last real token."""
    out: dict[str, Tensor] = {}
    last = int(one.last_index[0])

    def final_hook(t: Tensor, hook: Any) -> None:
        out["final"] = t[:, last].detach()
        raise StopForward

    try:
        run_batch(model, one, [*fwd_hooks, (final_resid_name(model), final_hook)])
    except (RuntimeError, ValueError) as e:  # ValueError: transformers' mask-shape checks
        raise PatchingError(
            f"the forward pass failed with a batch grown mid-pass ({e}); if this model's "
            "attention masks or position embeddings do not broadcast over a larger batch, use "
            "patch_activations(..., batching='stack')"
        ) from e
    if "final" not in out:
        raise RuntimeError(f"hook {final_resid_name(model)} did not fire during the forward pass")
    if out["final"].shape[0] != expect_rows:
        raise PatchingError(
            f"the batch grew to {out['final'].shape[0]} rows instead of {expect_rows}: this "
            "model does not pass a grown batch through; use patch_activations(..., batching='stack')"
        )
    return out["final"]


# --------------------------------------------------------------------------------------
# Shared-prefix passes
# --------------------------------------------------------------------------------------

PASS_COST_POSITIONS = 32
"""What one forward pass costs before it computes anything, in row-positions through the
whole model: the fixed work of a pass (hooks, kernel calls, every weight read once) over the
cost of one row-position through every layer, as measured on the embedded model
(``docs/benchmarks.md``). :func:`prefix_parts` weighs an extra pass against the positions it
saves."""


def prefix_parts(
    starts: Sequence[int], weights: Sequence[float], base: float, length: int
) -> list[list[int]]:
    """How to split a group of cells into passes that start at different positions. Cell
    ``k`` is patched at position ``starts[k]`` or later and costs ``weights[k]`` rows of the
    whole model per position (its examples times the fraction of the layers it computes); a
    pass over a part starting at position ``p`` computes positions ``p..length-1`` for its
    cells and for ``base`` unpatched rows, plus :data:`PASS_COST_POSITIONS`. Parts are runs
    of consecutive start positions chosen to minimise the total (exactly, by dynamic
    programming over the distinct positions). Returns the cells' indices per part, parts in
    position order."""
    pos = sorted(set(starts))
    weight = dict.fromkeys(pos, 0.0)
    for q, w in zip(starts, weights, strict=True):
        weight[q] += w
    best = [0.0] + [float("inf")] * len(pos)
    cut = [0] * (len(pos) + 1)
    for j in range(1, len(pos) + 1):  # the last part is pos[i:j]
        rows = base
        for i in range(j - 1, -1, -1):
            rows += weight[pos[i]]
            cost = best[i] + PASS_COST_POSITIONS + rows * (length - pos[i])
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], len(pos)
    while j:
        bounds.append((cut[j], j))
        j = cut[j]
    parts = []
    for i, j in reversed(bounds):
        members = set(pos[i:j])
        parts.append([k for k, q in enumerate(starts) if q in members])
    return parts


def _example_chunks(n_examples: int, n_cells: int, cells_per_batch: int) -> list[list[int]]:
    """Examples per pass: as many as keep the patched copies within ``cells_per_batch``."""
    per = max(1, cells_per_batch // max(1, n_cells))
    return [list(range(e, min(n_examples, e + per))) for e in range(0, n_examples, per)]


def _prefix_pass(
    plan: PassPlan,
    part: Sequence[int],
    examples: Sequence[int],
    record: PrefixRecord,
    branch: Mapping[int, str],
) -> Float[Tensor, "row d_model"]:
    """One pass of the cells ``part`` (indices into ``plan.cells``) over the ``examples``:
    rows ``0..E-1`` are the examples' unpatched targets; at the block input of each layer
    with cells, copies of those rows are appended (per example, that layer's cells in
    ``part`` order) and the cells write into them. The pass starts at the first patched
    position ``p`` and attends to the recorded keys and values before ``p``. Returns the
    final residual stream of every row at its example's last token: the unpatched rows,
    then per example its cells in ``part`` order."""
    model, cells, tgt = plan.model, plan.cells, plan.tgt
    ex = torch.tensor(list(examples))
    labels = torch.tensor([cells[i].position for i in part])
    p = int(plan.tgt_pos[labels][:, ex].min())
    lengths = tgt.lengths[ex]
    E = len(examples)
    by_layer: dict[int, list[int]] = {}
    for k, i in enumerate(part):
        by_layer.setdefault(cells[i].layer, []).append(k)
    cache = cache_upto(model, record, ex, p) if p else None
    row_of = torch.empty(E, len(part), dtype=torch.long)
    fwd_hooks: list[Hook] = []
    example_of_row = [torch.arange(E)]  # each row's example (index into ``examples``)
    n_rows = E
    for layer in sorted(by_layer):
        ks = by_layer[layer]
        src_rows = torch.arange(E).repeat_interleave(len(ks))
        example_of_row.append(src_rows)
        row_of[:, ks] = n_rows + torch.arange(E * len(ks)).view(E, len(ks))
        n_rows += E * len(ks)
        fwd_hooks.append((branch[layer], plan.brancher(src_rows)))
        if cache is not None:
            fwd_hooks.append((branch[layer], cache_grower(cache, layer, src_rows)))
    by_hook: dict[str, list[int]] = {}
    for k, i in enumerate(part):
        by_hook.setdefault(plan.names[(cells[i].site, cells[i].layer)], []).append(k)
    for name, ks in by_hook.items():
        rows = row_of[:, ks].reshape(-1)  # example-major
        sel = [cells[part[k]] for _ in range(E) for k in ks]
        example = ex.repeat_interleave(len(ks))
        fwd_hooks.extend(_cell_writer(plan, name, sel, rows, example, shift=p))
    sub = tgt.select(ex)
    last = lengths[torch.cat(example_of_row)] - 1 - p
    # a pass that does not end with n_rows rows fails in its last hook (a PatchingError)
    final = _guarded(lambda: run_on_cache(model, sub, cache, p, fwd_hooks, last))
    order = torch.cat([torch.arange(E), row_of.reshape(-1)])
    return final[order.to(final.device)]


def _guarded(run: Callable[[], Tensor]) -> Tensor:
    """``run()``, a failed forward pass turned into a :class:`PatchingError` that says how to
    patch without reusing the prefix."""
    try:
        return run()
    except (RuntimeError, ValueError) as e:  # ValueError: transformers' mask-shape checks
        raise PatchingError(
            f"the forward pass failed while reusing the unpatched target's keys and values "
            f"({e}); use patch_activations(..., reuse_prefix=False), or batching='stack'"
        ) from e


def shared_prefix_passes(plan: PassPlan) -> tuple[Tensor, Tensor]:
    """Grown passes that share the unpatched prefix too, over several examples at once.

    The target batch runs once, unpatched, with a key-value cache
    (:func:`mechlingo.activations.prefix.record_prefix`): its final residual stream gives the
    corrupted baseline, and its keys and values are kept. Then, per group of cells (in layer
    order) and chunk of examples (as many as keep the copies within ``cells_per_batch``), the
    group is split by patched position (:func:`prefix_parts`) and each part runs one pass
    over every example of the chunk: it starts at the part's first patched position ``p``
    and attends to the cached keys and values before ``p`` (a patch cannot change a causal
    model's earlier positions), and the batch grows by each layer's patched copies at its
    block input, as in :func:`grown_passes`. Rows stay right-padded and unmasked: a real
    position never attends to the padding after it."""
    model, tgt, cells, readouts = plan.model, plan.tgt, plan.cells, plan.readouts
    B = tgt.batch_size
    values = torch.empty(len(readouts), len(cells), B)
    record = _guarded(lambda: record_prefix(model, tgt))
    all_rows = torch.arange(B)
    corrupted = evaluate_readouts(model, record.final, readouts, plan.packed, all_rows).cpu()
    order = sorted(range(len(cells)), key=lambda i: cells[i].layer)  # stable
    branch = {layer: site_hook(model, "resid_pre", layer) for layer in {c.layer for c in cells}}
    n = int(model.cfg.n_layers)
    for start in plan.groups(len(order)):
        group = order[start : start + plan.cells_per_batch]
        finals, where = [], []
        labels = torch.tensor([cells[i].position for i in group])
        for examples in _example_chunks(B, len(group), plan.cells_per_batch):
            ex = torch.tensor(examples)
            starts = plan.tgt_pos[labels][:, ex].min(dim=1).values.tolist()
            weights = [len(examples) * (n - cells[i].layer) / n for i in group]
            width = int(tgt.lengths[ex].max())
            for part_k in prefix_parts(starts, weights, len(examples), width):
                part = [group[k] for k in part_k]
                f = _prefix_pass(plan, part, examples, record, branch)
                finals.append(f[len(examples) :])  # the unpatched rows are known already
                where.extend((i, b) for b in examples for i in part)
        ex_of = torch.tensor([b for _, b in where])
        v = evaluate_readouts(model, torch.cat(finals), readouts, plan.packed, ex_of).cpu()
        values[:, torch.tensor([i for i, _ in where]), ex_of] = v
    return values, corrupted

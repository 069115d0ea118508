"""Activation patching over a grid of cells (batched), cross-language patching and attention
knockout.

:func:`patch_activations` repeats the *target* ("corrupted") run with its activation at one
*cell* (a site, a layer, a token position, optionally a head) replaced by the *source*
("clean") run's, for a whole grid of cells, and reads a readout at the target's last real token:
the source activations are read once, many patched copies share one forward pass
(:mod:`~mechlingo.analyses.recall.patching.passes`), and each row's last token is unembedded
in one batched readout. For same-shape inputs the values equal ``transformer_lens.patching``'s.

Modules, lowest first: ``readouts`` (:class:`AnswerReadout`), ``positions`` (alignment across prompts
of different lengths), ``runs``, ``result`` (:class:`PatchingResult`), ``grid`` (shared with
:mod:`mechlingo.analyses.recall.attribution`), ``passes``, ``knockout`` (Geva et al. 2023).
The hook factories (``_writer``, ``_brancher``) are looked up here when a grid starts, so a test
can replace them. The method: ``docs/methods/recall-pipeline.md``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Unpack

import torch

from mechlingo.activations.prefix import prefix_reuse_supported
from mechlingo.analyses.recall.patching.errors import PatchingError
from mechlingo.analyses.recall.patching.grid import (
    PATCH_SITES,
    PatchingSetup,
    SiteGridArgs,
    check_sites,
    resolve_grid,
)
from mechlingo.analyses.recall.patching.knockout import (
    KnockoutResult,
    attention_knockout,
    sliding_windows,
)
from mechlingo.analyses.recall.patching.passes import (
    PassPlan,
    grown_passes,
    shared_prefix_passes,
    stacked_passes,
)
from mechlingo.analyses.recall.patching.passes import brancher as _brancher
from mechlingo.analyses.recall.patching.passes import writer as _writer
from mechlingo.analyses.recall.patching.positions import PositionLabel, subject_token_span
from mechlingo.analyses.recall.patching.readouts import (
    AnswerReadout,
    answer_logprob,
    evaluate_readouts,
    fact_readouts,
    logit_diff,
)
from mechlingo.analyses.recall.patching.result import (
    Cell,
    PatchingResult,
    readout_index,
)
from mechlingo.analyses.recall.patching.runs import read_run
from mechlingo.core.defaults import PROGRESS
from mechlingo.core.families import grows_mid_pass
from mechlingo.core.types import Model

__all__ = [
    "PATCH_SITES",
    "Cell",
    "KnockoutResult",
    "AnswerReadout",
    "PatchingResult",
    "PatchingError",
    "PositionLabel",
    "answer_logprob",
    "attention_knockout",
    "fact_readouts",
    "logit_diff",
    "readout_index",
    "patch_activations",
    "sliding_windows",
    "subject_token_span",
]


def _batching(batching: str, cells_per_batch: int | None, model: Model) -> tuple[str, int]:
    """The batching strategy and the cells per pass, checked."""
    if batching == "grow" and not grows_mid_pass(model):
        batching = "stack"  # same numbers; ALiBi biases cannot grow mid-pass (docs/models.md)
    if cells_per_batch is None:
        cells_per_batch = 256 if batching == "grow" else 32
    if cells_per_batch < 1:
        raise PatchingError("cells_per_batch must be >= 1")
    if batching not in ("grow", "stack"):
        raise PatchingError(f"batching must be 'grow' or 'stack', got {batching!r}")
    return batching, cells_per_batch


def _reuses_prefix(model: Model, setup: PatchingSetup, batching: str, wanted: bool | None) -> bool:
    """Whether grown passes reuse the unpatched prefix's keys and values: where the model
    supports it (:func:`mechlingo.activations.prefix.prefix_reuse_supported`), unless
    ``wanted`` is ``False``; ``True`` where it cannot is an error."""
    if wanted is False:
        return False
    if batching != "grow":
        if wanted:
            raise PatchingError("reuse_prefix=True needs batching='grow'")
        return False
    ok = prefix_reuse_supported(model, int(setup.tgt.lengths.max()))
    if wanted and not ok:
        raise PatchingError(
            "reuse_prefix=True, but this model's key-value cache cannot be reused here (cached "
            "decoding disagrees with uncached decoding, the model is not a TransformerLens "
            "bridge, or the target outgrows its sliding window); leave reuse_prefix=None"
        )
    return ok


def _run_passes(
    model: Model,
    setup: PatchingSetup,
    batching: str,
    cells_per_batch: int,
    reuse_prefix: bool | None = None,
    progress: bool = False,
) -> PatchingResult:
    """Read the source once, then run the patched passes of every cell."""
    names = setup.hook_names(model)
    reads = {n: setup.pos.source.T.contiguous() for n in dict.fromkeys(names.values())}
    src_acts, src_final = read_run(model, setup.src, reads)
    rows = torch.arange(setup.tgt.batch_size)
    clean = evaluate_readouts(model, src_final, setup.readouts, setup.packed, rows)
    cells = setup.cells()
    plan = PassPlan(
        model=model,
        tgt=setup.tgt,
        cells=cells,
        names=names,
        src_acts=src_acts,
        tgt_pos=setup.pos.target,
        readouts=setup.readouts,
        packed=setup.packed,
        cells_per_batch=cells_per_batch,
        writer=_writer,  # looked up here at call time: tests replace them on this module
        brancher=_brancher,
        progress=progress,
    )
    if _reuses_prefix(model, setup, batching, reuse_prefix):
        values, corrupted = shared_prefix_passes(plan)
    elif batching == "stack":
        values, corrupted = stacked_passes(plan)
    else:
        values, corrupted = grown_passes(plan)
    return setup.result(cells, values, clean.cpu(), corrupted)


def patch_activations(
    model: Model,
    source: Any,
    target: Any,
    sites: Sequence[str] | str = ("resid_pre",),
    *,
    cells_per_batch: int | None = None,
    batching: Literal["grow", "stack"] = "grow",
    reuse_prefix: bool | None = None,
    progress: bool = PROGRESS,
    **grid: Unpack[SiteGridArgs],
) -> PatchingResult:
    """Patch source activations into the target run, cell by cell, in batched passes.

    Args:
        model: a TransformerLens model.
        source: the run whose activations are patched in ("clean"): prompts, Facts or a
            :class:`~mechlingo.core.tokens.TokenBatch`.
        target: the run that is patched ("corrupted"), same number of rows as ``source``.
        sites: any of :data:`PATCH_SITES`; ``"head"`` patches one head's ``attn_z`` and adds
            the head axis (``heads``, default all).
        grid: the grid's ``layers``, ``positions``, ``readout``, ``alignment``, ``heads`` and
            subject spans (``source_subject``, ``target_subject``), as
            :class:`~mechlingo.analyses.recall.patching.grid.SiteGridArgs` describes them.
        cells_per_batch: patched copies per forward pass (memory grows with it). Default:
            256 with ``batching="grow"`` (a pass holds one example), 32 with ``"stack"`` (a
            pass holds every example that many times).
        batching: ``"grow"`` (default: the batch grows by each layer's patched copies at its
            block input, :mod:`~mechlingo.analyses.recall.patching.passes`) or ``"stack"``
            (every copy runs the whole model); the same numbers.
        reuse_prefix: with ``"grow"``, a copy patched at position ``p`` computes only
            positions ``p`` onwards against the target's cached keys and values. ``None``
            (default): where :func:`mechlingo.activations.prefix.prefix_reuse_supported`;
            ``False``: every position. The same numbers either way.
        progress: a progress bar over the groups of cells (``tqdm.auto``).

    Returns:
        A :class:`PatchingResult` with per-example values and the clean/corrupted baselines.

    Raises:
        PatchingError: mismatched rows, unknown sites, positions out of range, lengths that
            differ without an alignment, an unknown ``batching``, or a model that cannot run a
            batch grown mid-pass (the message says to use ``batching="stack"``).
    """
    mode, per_pass = _batching(batching, cells_per_batch, model)
    setup = resolve_grid(model, source, target, check_sites(sites), **grid)
    return _run_passes(model, setup, mode, per_pass, reuse_prefix, progress)

"""A patching grid resolved from its arguments: the same code for exact patching
(:func:`mechlingo.analyses.recall.patching.patch_activations`) and attribution patching
(:mod:`mechlingo.analyses.recall.attribution`), so both read the same cells the same way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from torch import Tensor

from mechlingo.analyses.recall.patching.errors import PatchingError
from mechlingo.analyses.recall.patching.positions import (
    PositionLabel,
    Positions,
    alignment_kind,
    as_batch,
    check_spans,
    resolve_positions,
)
from mechlingo.analyses.recall.patching.readouts import (
    AnswerReadout,
    PackedReadouts,
    fact_readouts,
    pack_readouts,
)
from mechlingo.analyses.recall.patching.result import Cell, PatchingResult
from mechlingo.analyses.recall.patching.runs import site_hook
from mechlingo.core.sites import RESIDUAL_SITES, resolve_layers, site_map
from mechlingo.core.tokens import TokenBatch
from mechlingo.core.types import Model

__all__ = [
    "PATCH_SITES",
    "GridArgs",
    "PatchingSetup",
    "SiteGridArgs",
    "check_sites",
    "resolve_grid",
]

#: Sites that patching can patch: the residual-shaped sites and ``"head"`` (one head's ``attn_z``).
PATCH_SITES: tuple[str, ...] = (*RESIDUAL_SITES, "head")


class GridArgs(TypedDict, total=False):
    """The keywords of :func:`resolve_grid` after the sites, which every patching function
    passes on (their defaults are :func:`resolve_grid`'s): the grid's layers, positions and
    readouts.

    * ``layers``: layers to patch (default all; negatives from the end).
    * ``positions``: grid positions: ints (non-negative = absolute token index; negative =
      counted back from each row's last real token), ``"last"``, ``"subject_first"``,
      ``"subject_last"``. Default: every position for same-shape inputs, ``[-1]`` under
      ``alignment="last"``, subject first/last and the last token under ``"subject"``.
    * ``readout``: what each patched run is read out as, a
      :class:`~mechlingo.analyses.recall.patching.readouts.AnswerReadout` or several (all read from
      the same patched passes); default when the source is Facts:
      :func:`~mechlingo.analyses.recall.patching.readouts.fact_readouts` of the source facts
      (their answer and English answer). For cross-language patching pass the readout of
      the target facts.
    * ``alignment``: ``None`` (same shapes), ``"last"``, ``"subject"``, or ``{target: source}``.
    * ``source_subject``, ``target_subject``: inclusive subject token spans per row when the
      inputs are not Facts.
    """

    layers: Any
    positions: Sequence[PositionLabel] | None
    readout: AnswerReadout | Sequence[AnswerReadout] | None
    alignment: str | Mapping[int, int] | None
    source_subject: Sequence[tuple[int, int]] | None
    target_subject: Sequence[tuple[int, int]] | None


class SiteGridArgs(GridArgs, total=False):
    """:class:`GridArgs` of a grid of sites, plus ``heads``: the heads of the ``"head"`` site
    (default all)."""

    heads: Sequence[int] | None


def check_sites(sites: Sequence[str] | str) -> list[str]:
    """The sites as a list; each must be one of :data:`PATCH_SITES`."""
    sites = [sites] if isinstance(sites, str) else list(sites)
    if not sites:
        raise PatchingError("no sites to patch")
    for s in sites:
        if s not in PATCH_SITES:
            raise PatchingError(f"unknown patching site {s!r}; use one of {list(PATCH_SITES)}")
    return sites


@dataclass
class PatchingSetup:
    """Everything patching needs before its first pass: the source and target batches, the
    aligned positions, the readouts (and their packed token sets) and the grid's axes."""

    src: TokenBatch
    tgt: TokenBatch
    pos: Positions
    readouts: list[AnswerReadout]
    packed: PackedReadouts
    sites: list[str]
    layers: list[int]
    heads: list[int]
    alignment: str

    def hook_names(self, model: Model) -> dict[tuple[str, int], str]:
        """The hook of every ``(site, layer)`` of the grid."""
        return {(s, layer): site_hook(model, s, layer) for s in self.sites for layer in self.layers}

    def cells(self) -> list[Cell]:
        """Every cell of the grid, in result order (site, layer, position, head)."""
        return [
            Cell(s, layer, p, h)
            for s in self.sites
            for layer in self.layers
            for p in range(len(self.pos.labels))
            for h in (self.heads if s == "head" else [-1])
        ]

    def result(
        self,
        cells: list[Cell],
        values: Tensor,
        clean: Tensor,
        corrupted: Tensor,
        meta: dict[str, Any] | None = None,
    ) -> PatchingResult:
        """A :class:`PatchingResult` of this grid with the given per-example values."""
        return PatchingResult(
            cells=cells,
            readout_names=[m.name for m in self.readouts],
            values=values,
            clean=clean,
            corrupted=corrupted,
            sites=self.sites,
            layers=self.layers,
            heads=self.heads,
            position_labels=self.pos.labels,
            target_positions=self.pos.target,
            source_positions=self.pos.source,
            alignment=self.alignment,
            meta=meta or {},
        )


def _resolve_heads(model: Model, heads: Sequence[int] | None) -> list[int]:
    n_heads = site_map(model).n_heads
    head_list = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in head_list if not 0 <= h < n_heads]
    if bad or not head_list:
        raise PatchingError(f"heads {bad or head_list} invalid: this model has {n_heads}")
    return head_list


def _resolve_readouts(
    model: Model, source: Any, readout: AnswerReadout | Sequence[AnswerReadout] | None
) -> list[AnswerReadout]:
    if readout is None:
        if isinstance(source, Sequence) and source and hasattr(source[0], "answer"):
            readout = fact_readouts(model, list(source))
        else:
            raise PatchingError("pass readout= (e.g. answer_logprob(model, answers, langs))")
    return [readout] if isinstance(readout, AnswerReadout) else list(readout)


def resolve_grid(
    model: Model,
    source: Any,
    target: Any,
    sites: list[str],
    **grid: Unpack[SiteGridArgs],
) -> PatchingSetup:
    """Resolve a grid's arguments (``sites`` already checked by :func:`check_sites`, possibly
    empty for a grid without sites; the others as :class:`SiteGridArgs` describes them) into a
    :class:`PatchingSetup`.

    Raises:
        PatchingError: an unknown keyword, mismatched rows, bad subject spans, heads or
            positions, or no readout for inputs that are not Facts.
    """
    unknown = sorted(set(grid) - SiteGridArgs.__required_keys__ - SiteGridArgs.__optional_keys__)
    if unknown:
        known = sorted(SiteGridArgs.__optional_keys__)
        raise PatchingError(f"unknown patching keyword {unknown[0]!r}; pass one of {known}")
    layers, positions, heads = grid.get("layers"), grid.get("positions"), grid.get("heads")
    readout, alignment = grid.get("readout"), grid.get("alignment")
    source_subject, target_subject = grid.get("source_subject"), grid.get("target_subject")
    src, src_spans = as_batch(model, source, "source")
    tgt, tgt_spans = as_batch(model, target, "target")
    if src.batch_size != tgt.batch_size:
        raise PatchingError(
            f"source has {src.batch_size} rows and target {tgt.batch_size}; patching pairs "
            "row i of the source with row i of the target"
        )
    src_spans = check_spans(source_subject, src, "source") or src_spans
    tgt_spans = check_spans(target_subject, tgt, "target") or tgt_spans
    layer_list = resolve_layers(model, layers)
    head_list = _resolve_heads(model, heads) if "head" in sites else []
    pos = resolve_positions(positions, alignment, src, tgt, src_spans, tgt_spans)
    readouts = _resolve_readouts(model, source, readout)
    packed = pack_readouts(readouts, tgt.batch_size)
    kind = alignment_kind(alignment)
    return PatchingSetup(src, tgt, pos, readouts, packed, sites, layer_list, head_list, kind)

"""The per-language patching of ``mechlingo trace``: which layers and positions carry a fact.

For each language, :func:`corrupted_pairs` takes the facts the model answers correctly (the
clean runs) and pairs each with another subject of another answer (the corrupted runs);
:func:`measure_patching` runs the corrupted-subject sweep at :data:`PATCH_POSITIONS` (exact
activation patching, attribution patching, or both compared), and :func:`patch_language` adds
the attention knockout and the layer bands of the pipeline's three phases
(:func:`pipeline_phases`) as a :class:`LanguagePatching`. :func:`unpatched_reason` says why a
language gets none. The trace that picks the clean runs is
:func:`mechlingo.analyses.recall.trace.trace_recall`; the whole command is
:func:`mechlingo.analyses.recall.trace.run_trace`. ``docs/methods/recall-pipeline.md`` shows
what the embedded model gives."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mechlingo.analyses.recall.attribution import (
    attribution_patch,
    compare_patching,
    verify_top_cells,
)
from mechlingo.analyses.recall.patching import (
    attention_knockout,
    fact_readouts,
    patch_activations,
)
from mechlingo.analyses.recall.trace_options import TraceOptions
from mechlingo.core.defaults import PROGRESS
from mechlingo.core.tokens import encode
from mechlingo.core.types import Model

if TYPE_CHECKING:
    from mechlingo.analyses.recall.patching import KnockoutResult, PatchingResult
    from mechlingo.data import Fact

__all__ = [
    "PATCH_POSITIONS",
    "LanguagePatching",
    "PatchableTrace",
    "corrupted_pairs",
    "measure_patching",
    "patch_language",
    "pipeline_phases",
    "unpatched_reason",
]

#: Grid positions of the corrupted-subject patching: the subject's first and last token and
#: the last two prompt tokens (aligned by subject span and from the end).
PATCH_POSITIONS: list[int | str] = ["subject_first", "subject_last", -2, -1]


class PatchableTrace(Protocol):
    """What the patching reads of a :class:`~mechlingo.analyses.recall.trace.TraceResult`:
    its per-query records (``id``, ``lang``, ``correct``), its languages, its depth and the
    median first layers at which the English and the prompt-language answer are decodable."""

    records: list[dict[str, Any]]
    n_layers: int

    @property
    def langs(self) -> list[str]: ...

    def headline_layers(self) -> dict[str, dict[str, float | None]]: ...


def pipeline_phases(
    sweep: PatchingResult | None, trace: PatchableTrace | None, lang: str, *, readout: str | int = 0
) -> dict[str, tuple[float, float]]:
    """Layer bands of the three phases, from the data:

    * *subject enrichment*: the span of MLP layers at subject positions whose normalised effect
      is at least half the largest such effect (from the sweep);
    * *English recall*: from the median first lens entry where the English answer reaches rank
      <= ``max_rank`` to the median first entry of the L answer (from the trace; lens entry
      ``e`` = after ``e`` blocks, drawn at block ``e - 1``);
    * *conversion to L*: from the median first L-answer entry to the last layer.

    Phases the data does not support (no MLP effect at subject positions, no query where the
    English answer is decodable) are left out.
    """
    out: dict[str, tuple[float, float]] = {}
    if sweep is not None:
        vals = sweep.normalized(readout)
        subj = [
            (c.layer, float(vals[i]))
            for i, c in enumerate(sweep.cells)
            if c.site == "mlp_out"
            and str(sweep.position_labels[c.position]).startswith("subject")
            and not math.isnan(float(vals[i]))
        ]
        if subj:
            top = max(v for _, v in subj)
            if top > 0:
                layers = [layer for layer, v in subj if v >= top / 2]
                out["subject enrichment"] = (min(layers), max(layers))
    if trace is not None and lang in trace.langs:
        h = trace.headline_layers()[lang]
        n = trace.n_layers
        en, ans = h["median_first_en_layer"], h["median_first_answer_layer"]
        if en is not None:
            end = ans - 1 if ans is not None and ans > en else n - 1
            out["English recall"] = (max(0.0, en - 1), max(en - 1, end - 1))
        if ans is not None and lang != "en":
            out[f"conversion to {lang}"] = (max(0.0, ans - 1), float(n - 1))
    return out


@dataclass
class LanguagePatching:
    """What the corrupted-subject patching of one language produced.

    ``sweep`` is the exact :class:`~mechlingo.analyses.recall.patching.PatchingResult` (or, with
    ``method="atp"``, the attribution-patching one); ``atp`` the attribution-patching sweep
    when one ran (methods ``atp`` and ``both``). ``comparison`` (AtP against exact, per
    site), ``seconds`` (of each method) and ``verified_heads`` (the top AtP heads patched
    exactly) are ``None`` when not measured. ``phases`` are the pipeline phases drawn on
    the circuit, ``token_labels`` the grid positions' labels; ``n_unanswered`` counts the
    clean prompts the model answers wrongly (0 unless asked for: :func:`corrupted_pairs`).
    """

    lang: str
    method: str
    sweep: PatchingResult
    knockout: KnockoutResult
    phases: dict[str, Any]
    token_labels: list[str]
    atp: PatchingResult | None = None
    comparison: dict[str, Any] | None = None
    seconds: dict[str, float] | None = None
    verified_heads: list[dict[str, Any]] | None = None
    n_unanswered: int = 0

    @property
    def separate_atp(self) -> bool:
        """Whether the AtP sweep is measured beside an exact one (``method="both"``)."""
        return self.atp is not None and self.atp is not self.sweep

    def to_json(self) -> dict[str, Any]:
        """The language's record of ``patching.json`` (NaN left as is: see
        :func:`mechlingo.core.jsonable.jsonable`)."""
        out: dict[str, Any] = {
            "method": self.method,
            "sweep": self.sweep.summary(),
            "cells": self.sweep.to_dataframe().to_dict(orient="records"),
            "knockout": self.knockout.to_dataframe().to_dict(orient="records"),
        }
        if self.atp is not None and self.separate_atp:
            out["atp_sweep"] = self.atp.summary()
            out["atp_cells"] = self.atp.to_dataframe().to_dict(orient="records")
        for key in ("comparison", "seconds", "verified_heads"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["phases"] = self.phases
        return out


def corrupted_pairs(
    trace: PatchableTrace, facts: Sequence[Fact], lang: str, n: int, *, unanswered: bool = False
) -> tuple[list[Fact], list[Fact]] | None:
    """Up to ``n`` clean facts of ``lang`` that the model answers correctly (in trace order)
    and, for each, a corrupted fact: another subject with another answer (the ``7 k``-th
    such fact of the language, cyclically). ``None`` when no fact of the language is
    answered correctly or it has fewer than two facts: a circuit is only drawn from
    prompts whose clean run gives the answer (:func:`unpatched_reason` says why not).

    With ``unanswered`` the wrongly answered facts fill the ``n`` after the correct ones (an
    explicit choice, e.g. for a model that answers nothing; :func:`patch_language` counts
    them into the result's ``n_unanswered`` and the report says so)."""
    if unpatched_reason(trace, lang, unanswered=unanswered) is not None:
        return None
    by_id = {f.id: f for f in facts if f.lang == lang}
    recs = [r for r in trace.records if r["lang"] == lang]
    order = [r for r in recs if r["correct"]]
    if unanswered:
        order += [r for r in recs if not r["correct"]]
    clean = [by_id[r["id"]] for r in order][:n]
    pool = [by_id[r["id"]] for r in recs]
    corrupt = []
    for k, f in enumerate(clean):
        others = [g for g in pool if g.answer != f.answer and g.id != f.id]
        corrupt.append(others[(k * 7) % len(others)] if others else pool[(k + 1) % len(pool)])
    return clean, corrupt


def unpatched_reason(trace: PatchableTrace, lang: str, *, unanswered: bool = False) -> str | None:
    """Why ``lang`` gets no patching (``None``: it does): fewer than two facts, or none the
    model answers correctly (unless ``unanswered``)."""
    recs = [r for r in trace.records if r["lang"] == lang]
    if len(recs) < 2:
        return f"{len(recs)} fact(s) in {lang}: a corrupted-subject pair needs two"
    if not unanswered and not any(r["correct"] for r in recs):
        return (
            f"none of the {len(recs)} {lang} prompts is answered correctly, so there is no "
            "clean run to restore: no circuit or heatmap is drawn"
        )
    return None


def measure_patching(
    model: Model,
    clean: Sequence[Fact],
    corrupt: Sequence[Fact],
    *,
    sites: Sequence[str] = ("attn_out", "mlp_out"),
    method: str = "exact",
    cells_per_batch: int | None = None,
    verify_heads: int = 5,
    progress: bool = PROGRESS,
) -> tuple[PatchingResult | None, PatchingResult | None, dict[str, Any]]:
    """The corrupted-subject sweep(s) of ``method`` at :data:`PATCH_POSITIONS`:
    ``(exact or None, atp or None, extras)``; the extras are AtP's ``comparison`` with exact
    and ``seconds`` (method ``both``), and ``verified_heads`` (the top ``verify_heads`` AtP
    heads patched exactly)."""
    sites = list(sites) or ["resid_pre"]
    kw = {"positions": PATCH_POSITIONS, "readout": fact_readouts(model, list(clean)),
          "alignment": "subject"}  # fmt: skip
    sweep = atp = None
    if method in ("exact", "both"):
        t0 = time.perf_counter()
        # with both methods, the exact grid has the heads too (compared per site)
        grid = list(dict.fromkeys([*sites, "head"])) if method == "both" else sites
        sweep = patch_activations(
            model, clean, corrupt, grid, cells_per_batch=cells_per_batch, progress=progress, **kw
        )
        sweep.meta["seconds"] = round(time.perf_counter() - t0, 4)
    extra: dict[str, Any] = {}
    if method in ("atp", "both"):
        atp = attribution_patch(model, clean, corrupt, list(dict.fromkeys([*sites, "head"])), **kw)
        if sweep is not None:
            extra["comparison"] = compare_patching(atp, sweep)
            extra["seconds"] = {"exact": sweep.meta["seconds"], "atp": atp.meta["seconds"]}
        if verify_heads > 0:
            extra["verified_heads"] = verify_top_cells(
                model, clean, corrupt, atp, k=verify_heads, **kw
            )
    return sweep, atp, extra


def patch_language(
    model: Model,
    trace: PatchableTrace,
    facts: Sequence[Fact],
    lang: str,
    options: TraceOptions | None = None,
) -> LanguagePatching | None:
    """Corrupted-subject patching (:func:`corrupted_pairs`, :func:`measure_patching`) and
    attention knockout for one language, from correctly answered clean prompts only
    (``None`` when there is none, or fewer than two facts: :func:`unpatched_reason`).
    ``options``: :class:`~mechlingo.analyses.recall.trace_options.TraceOptions` (its
    ``patch_prompts``, ``patch_sites``, ``method``, ``cells_per_batch``, ``verify_heads``,
    ``unanswered`` and ``progress``; its defaults when ``None``)."""
    o = TraceOptions() if options is None else options
    method = o.method
    pairs = corrupted_pairs(trace, facts, lang, o.patch_prompts, unanswered=o.unanswered)
    if pairs is None:
        return None
    clean, corrupt = pairs
    correct = {r["id"] for r in trace.records if r["lang"] == lang and r["correct"]}
    n_wrong = sum(f.id not in correct for f in clean)
    sweep, atp, extra = measure_patching(model, clean, corrupt, sites=o.patch_sites,
                                         method=method, cells_per_batch=o.cells_per_batch,
                                         verify_heads=o.verify_heads,
                                         progress=o.progress)  # fmt: skip
    for sw in (sweep, atp):
        if sw is not None:
            sw.meta.update({"clean": [f.prompt for f in clean],
                            "corrupted": [f.prompt for f in corrupt],
                            "answers": [f.answer for f in clean],
                            "n_unanswered": n_wrong})  # fmt: skip
    main = sweep if sweep is not None else atp
    assert main is not None  # method is exact, atp or both
    return LanguagePatching(
        lang=lang,
        method=method,
        sweep=main,
        knockout=attention_knockout(model, clean),
        phases=pipeline_phases(main, trace, lang),
        token_labels=_token_labels(model, atp if atp is not None else main, clean),
        atp=atp,
        n_unanswered=n_wrong,
        **extra,
    )


def _token_labels(model: Model, sweep: PatchingResult, clean: Sequence[Fact]) -> list[str]:
    """Each grid position's label with the clean (source) prompt's token there."""
    batch = encode(model, [clean[0].prompt])
    ids = batch.tokens[0].tolist()
    labels = []
    for p, label in enumerate(sweep.position_labels):
        tok = model.tokenizer.decode([ids[int(sweep.source_positions[p, 0])]])
        labels.append(f"{label}<br>{tok!r}")
    return labels

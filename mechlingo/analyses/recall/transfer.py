"""Are the repair vectors independent of dataset and language? The transfer matrix.

Lu et al. (2025) call their two repair vectors "independent of languages and datasets".
:func:`transfer_matrix` measures that claim cell by cell, ``by="relation"`` (rows ``all``,
``all_but_R``, ``only_A``; columns the test relation R, so ``all_but_R`` x R is the transfer
test proper) or ``by="lang"`` (rows ``all`` and ``all_but_L``, tested on L);
:func:`transfer_matrices` runs both, as ``mechlingo steer eval --transfer`` does. Each row's
layer and alpha are chosen on the dev split of its build relations (languages) only, by
:func:`mechlingo.analyses.recall.dev_grid.choose_on_dev`; each cell reports the gain over
``orig`` with a paired bootstrap interval and an exact McNemar p, the same for a norm-matched
random control, and the vectors against the control (:class:`TransferMatrix`).

The build facts run once per (relation, language) group and each row's vectors are pooled
from its groups (:mod:`mechlingo.analyses.recall.group_vectors`); ``**score_kw`` reaches the scoring
call unchanged. The protocol and the measured matrices: ``docs/methods/repair-vectors.md``."""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from mechlingo.activations.memo import PrefixMemo, reusing_prefixes
from mechlingo.analyses.recall import dev_grid, group_vectors
from mechlingo.analyses.recall.dev_grid import LeakError, check_disjoint
from mechlingo.analyses.recall.group_vectors import (
    GroupStats,
    balance_relations,
    group_stats,
    spread,
)
from mechlingo.analyses.recall.settings import (
    BuildSettings,
    DevGrid,
    MatrixSettings,
    ScoringOptions,
    SplitSettings,
    matrix_layers,
)
from mechlingo.analyses.recall.steering import SteeringConfig, SteeringPair
from mechlingo.analyses.results import WritesFolder
from mechlingo.core.errors import InputError
from mechlingo.core.jsonable import jsonable
from mechlingo.core.types import Model
from mechlingo.data import RELATIONS, Fact
from mechlingo.data.splits import split_facts
from mechlingo.interventions import Compose, Intervention, SteeringVector, random_like
from mechlingo.kernels.significance import Interval, mcnemar, paired_gain
from mechlingo.scoring.evaluate import DecodeOptions, EvalResult
from mechlingo.scoring.share import gold_share
from mechlingo.viz.steer import transfer_heatmap

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = [
    "MatrixShared",
    "TransferMatrices",
    "TransferMatrix",
    "transfer_matrices",
    "transfer_matrix",
]

# --------------------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------------------


def _g(iv: Interval) -> dict[str, Any]:
    return {"estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi}


@dataclass
class TransferMatrix:
    """Test gains of vectors built on some relations (languages) and tested on another.

    Attributes:
        by: ``"relation"`` or ``"lang"``.
        cells: one dict per measured cell: ``row`` (``"all"``, ``"all_but_<R>"``,
            ``"only_<A>"``), ``col`` (the test relation or language), ``n`` (test items,
            non-English), ``gain`` and ``control_gain`` (``{"estimate", "lo", "hi"}``, a
            paired bootstrap 95% interval of the accuracy gain over ``orig``), ``p`` and
            ``control_p`` (exact McNemar against ``orig``), ``vs_control_p``, ``accuracy``
            (``orig``, ``steered``, ``control``), ``selected``, ``dev_effect``,
            ``config`` and ``layer``/``alpha`` of the selected vector(s), and what the row
            was built and chosen on; ``items`` (per test item, in the order of the
            outcomes: fact ``ids`` and the 0/1 outcomes ``orig``, ``steered``, ``control``).
        rows, cols: their order.
        choices: per row, what was built and what dev chose.
        meta: sizes, options and seconds.
    """

    by: str
    cells: list[dict[str, Any]]
    rows: list[str]
    cols: list[str]
    choices: dict[str, dict[str, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    stats: GroupStats | None = field(default=None, repr=False, compare=False)

    def cell(self, row: str, col: str) -> dict[str, Any] | None:
        """The cell of ``row`` x ``col`` (``None`` if it was not measured)."""
        return next((c for c in self.cells if c["row"] == row and c["col"] == col), None)

    def to_json(self) -> dict[str, Any]:
        """Everything, JSON-ready."""
        return jsonable(
            {
                "by": self.by,
                "rows": self.rows,
                "cols": self.cols,
                "cells": self.cells,
                "choices": self.choices,
                "meta": self.meta,
                "summary": self.summary(),
            }
        )

    def to_dataframe(self) -> pd.DataFrame:
        """One row per cell, the intervals flattened (``gain``, ``gain_lo``, ``gain_hi``...)."""
        import pandas as pd

        flat = []
        for c in self.cells:
            r = {k: v for k, v in c.items() if not isinstance(v, (dict, list))}
            for key in ("gain", "control_gain"):
                r[key], r[f"{key}_lo"], r[f"{key}_hi"] = (
                    c[key][x] for x in ("estimate", "lo", "hi")
                )
            r.update({f"acc_{k}": v for k, v in c["accuracy"].items()})
            flat.append(r)
        return pd.DataFrame(flat)

    def summary(self) -> dict[str, Any]:
        """Per kind of row (``all``, ``all_but``, ``only_same``: only R on R, ``only_other``:
        only A on R != A): cells, mean gain, and how many cells have an interval above 0,
        below 0, or containing 0; the same for the control."""
        kinds: dict[str, list[dict[str, Any]]] = {}
        for c in self.cells:
            kinds.setdefault(_kind(c["row"], c["col"]), []).append(c)
        out = {}
        for k, cs in kinds.items():
            out[k] = {"cells": len(cs), **_tally(cs, "gain"), "control": _tally(cs, "control_gain")}
        return out

    def fig_transfer(self, value: str = "gain") -> go.Figure:
        """Heatmap of ``value`` (``"gain"`` or ``"control_gain"``) over rows x columns, each
        cell labelled with its estimate, 95% interval and n
        (:func:`mechlingo.viz.steer.transfer_heatmap`)."""
        return transfer_heatmap(self.cells, rows=self.rows, cols=self.cols, by=self.by, value=value)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.cols)
        body = []
        for r in self.rows:
            tds = []
            for c in self.cols:
                cell = self.cell(r, c)
                tds.append(f"<td>{html.escape(cell_text(cell))}</td>" if cell else "<td></td>")
            body.append(f"<tr><th>{html.escape(r)}</th>{''.join(tds)}</tr>")
        return (
            f"<b>TransferMatrix</b> by {html.escape(self.by)}: accuracy gain over orig in "
            "points [95% CI] (control)<table><tr><th></th>"
            f"{head}</tr>{''.join(body)}</table>"
        )


def cell_text(cell: dict[str, Any]) -> str:
    """``"+12.5 [+6.0, +19.3] (ctrl -1.1)"``: a cell's gain in points."""

    def pt(x: Any) -> str:
        return "n/a" if x is None else f"{100 * x:+.1f}"

    g, c = cell["gain"], cell["control_gain"]
    return f"{pt(g['estimate'])} [{pt(g['lo'])}, {pt(g['hi'])}] (ctrl {pt(c['estimate'])})"


def _kind(row: str, col: str) -> str:
    if row == "all":
        return "all"
    if row.startswith("all_but_"):
        return "all_but"
    return "only_same" if row == f"only_{col}" else "only_other"


def _tally(cells: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    ivs = [
        Interval(c[key]["estimate"], c[key]["lo"], c[key]["hi"], int(c.get("n", 0))) for c in cells
    ]
    est = [iv.estimate for iv in ivs if iv.estimate is not None]
    up = sum(1 for iv in ivs if iv.above(0.0))
    down = sum(1 for iv in ivs if iv.below(0.0))
    return {
        "mean_gain": sum(est) / len(est) if est else None,
        "ci_above_0": up,
        "ci_below_0": down,
        "ci_contains_0": len(cells) - up - down,
    }


# --------------------------------------------------------------------------------------
# The matrix
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    name: str
    relations: tuple[str, ...]
    langs: tuple[str, ...]
    cols: tuple[str, ...]


def _rows(
    by: str, relations: list[str], langs: list[str], held: list[str], cells: str
) -> list[_Row]:
    rel, lg = tuple(relations), tuple(langs)
    out = [_Row("all", rel, lg, tuple(held))]
    if by == "relation":
        out += [_Row(f"all_but_{r}", tuple(x for x in rel if x != r), lg, (r,)) for r in held]
        for a in relations:
            cols = tuple(held) if cells == "full" else tuple(c for c in held if c == a)
            if cols:
                out.append(_Row(f"only_{a}", (a,), lg, cols))
    else:
        out += [_Row(f"all_but_{x}", rel, tuple(y for y in lg if y != x), (x,)) for x in held]
    return out


def _held_out_check(
    stage: str,
    row: _Row,
    *,
    facts: Iterable[Fact] = (),
    ids: Iterable[str] = (),
    langs: Iterable[str] = (),
    relation_of: dict[str, str] | None = None,
) -> None:
    """Raise :class:`LeakError` if a build or choice step of ``row`` received a fact of a
    relation or language outside the row's own (so never the held-out one)."""
    bad = [
        f"{f.id}:{f.lang}"
        for f in facts
        if f.relation not in row.relations or f.lang not in row.langs
    ]
    rel = relation_of or {}
    bad += [i for i in ids if rel.get(i, i.split("/")[0]) not in row.relations]
    bad += [f"language {x}" for x in langs if x not in row.langs]
    if bad:
        raise LeakError(f"row {row.name}: {len(bad)} held-out fact(s) reached {stage}: {bad[:5]}")


#: Seed step between a cell's random draws (draw i: ``seed + CONTROL_SEED_STEP * i``; the
#: task and diff parts of one draw differ by 1000, so the step keeps draws apart).
CONTROL_SEED_STEP = 7919


def _control(vectors: SteeringPair, cfg: SteeringConfig, selected: str, seed: int) -> Intervention:
    """Random directions with the norms of the selected vector(s), at the same places."""
    parts = []
    if selected in ("task", "both"):
        v = vectors.task.at(cfg.task_layer, cfg.task_alpha).direction()
        parts.append(SteeringVector(random_like(v, seed), cfg.task_layer, cfg.task_alpha))
    if selected in ("diff", "both"):
        v = vectors.diff.at(cfg.diff_layer, cfg.diff_alpha).direction()
        parts.append(SteeringVector(random_like(v, seed + 1000), cfg.diff_layer, cfg.diff_alpha))
    return Compose(parts)


def _steered(vectors: SteeringPair, cfg: SteeringConfig, selected: str) -> Intervention:
    task = vectors.task.at(cfg.task_layer, cfg.task_alpha)
    diff = vectors.diff.at(cfg.diff_layer, cfg.diff_alpha)
    return {"task": task, "diff": diff}.get(selected, task + diff)


def _place(cfg: SteeringConfig, selected: str) -> dict[str, Any]:
    if selected == "task":
        return {"layer": cfg.task_layer, "alpha": cfg.task_alpha}
    if selected == "diff":
        return {"layer": cfg.diff_layer, "alpha": cfg.diff_alpha}
    return {"layer": [cfg.task_layer, cfg.diff_layer], "alpha": [cfg.task_alpha, cfg.diff_alpha]}


def _sorted(res: EvalResult) -> list[dict[str, Any]]:
    rows = sorted(res.records, key=lambda r: (r["id"], r["lang"]))
    return [r for r in rows if r["lang"] != "en"]


def _outcomes(res: EvalResult) -> list[bool]:
    return [bool(r["correct"]) for r in _sorted(res)]


def _shares(res: EvalResult) -> list[float] | None:
    """Each non-English item's gold share among the candidates
    (:func:`~mechlingo.scoring.share.gold_share`), or ``None`` when an item has none (a
    metric without candidate scores)."""
    out = [gold_share(r) for r in _sorted(res)]
    return None if any(x is None for x in out) else [float(x) for x in out]  # type: ignore[arg-type]


def _cell_stats(orig: EvalResult, steered: EvalResult, control: EvalResult, seed: int,
                more: Sequence[EvalResult] = ()) -> dict:  # fmt: skip
    """A cell's gains and per-item outcomes; ``more``: the random population's further draws
    (``items["controls"]``: every draw's outcomes, ``control`` first; ``items["share"]``: the
    gold shares of orig, steered and each draw where the metric ranks candidates)."""
    o, s, c = _outcomes(orig), _outcomes(steered), _outcomes(control)
    m, mc = mcnemar(o, s), mcnemar(o, c)
    items: dict[str, Any] = {"ids": [r["id"] for r in _sorted(orig)], "orig": o, "steered": s,
                             "control": c}  # fmt: skip
    if more:
        items["controls"] = [c, *(_outcomes(x) for x in more)]
    shares = [_shares(x) for x in (orig, steered, control, *more)]
    if all(x is not None for x in shares):
        items["share"] = {"orig": shares[0], "steered": shares[1], "controls": shares[2:]}
    return {
        "n": len(o),
        "gain": _g(paired_gain(o, s, seed=seed)),
        "p": m["p"],
        "fixed": m["fixed"],
        "broken": m["broken"],
        "control_gain": _g(paired_gain(o, c, seed=seed)),
        "control_p": mc["p"],
        "vs_control_p": mcnemar(c, s)["p"],
        "accuracy": {
            k: sum(v) / len(v) if v else None
            for k, v in (("orig", o), ("steered", s), ("control", c))
        },
        "items": items,
    }


def _choose(
    model: Model,
    vectors: SteeringPair,
    dev: list[Fact],
    test: list[Fact],
    m: MatrixSettings,
    kw: dict[str, Any],
) -> dev_grid.Choice:
    """The protocol's dev sweep on the row's dev facts with the matrix's grid (``m.layers``
    already resolved)."""
    grid = DevGrid(
        task_layers=m.layers,
        diff_layers=m.layers,
        task_alphas=m.alphas,
        diff_alphas=m.alphas,
        top_k=m.top_k,
        screen_ids=m.screen_ids,
        en_tolerance=m.en_tolerance,
        p_threshold=m.p_threshold,
    )
    kw = dict(kw)
    decoding = kw.pop("decoding")
    scoring = ScoringOptions(
        metric=kw.pop("metric", "generate"),
        max_new_tokens=decoding.max_new_tokens,
        batch_size=decoding.batch_size,
    )
    return dev_grid.choose_on_dev(
        model, vectors, dev, grid=grid, scoring=scoring, test_ids=test, **kw
    ).choice


@dataclass
class MatrixShared:
    """What the transfer matrices of one run share (pass it as ``stats=`` to each): the build
    statistics, built by the first matrix, and the dev choices, keyed by everything a choice
    depends on (the row's build relations and languages, its dev facts, the grid, the build
    and scoring settings), so that equal rows search once: with two relations ``all_but_A`` is
    ``only_B``, and the ``all`` row is the same in both matrices."""

    stats: GroupStats | None = None
    choices: dict[Any, dev_grid.Choice] = field(default_factory=dict)


def transfer_matrix(
    model: Model,
    facts: Sequence[Fact],
    *,
    by: str = "relation",
    matrix: MatrixSettings | None = None,
    build: BuildSettings | None = None,
    split: SplitSettings | None = None,
    scoring: ScoringOptions | None = None,
    on_cell: Callable[[dict[str, Any]], None] | None = None,
    stats: GroupStats | MatrixShared | None = None,
    **score_kw: Any,
) -> TransferMatrix:
    """The transfer matrix of the two repair vectors, one cell per (build row, test column).

    Args:
        facts: every relation and language to use, English included (it is the dev
            constraint: English may not drop by more than ``matrix.en_tolerance``); split by
            id into build/dev/test with ``split.fractions`` and ``split.salt``.
        by: ``"relation"`` (rows all / all_but_R / only_A, columns the test relation) or
            ``"lang"`` (rows all / all_but_L, columns the non-English test language).
        (the columns are ``matrix.held_out``: default every relation, or every non-English
        language.)
        matrix, build, scoring: the sizes and dev grid, how each row's vectors are built, and
            how every item is scored (:class:`~mechlingo.analyses.recall.settings.MatrixSettings`,
            ``BuildSettings``, ``ScoringOptions``; ``None`` takes the class's defaults).
        on_cell: called with each cell as soon as it is measured (e.g. to save progress).
        stats: the build statistics of an earlier call on the same facts and split
            (``TransferMatrix.stats``), to run the other ``by`` without building again;
            checked to hold exactly this call's build fact ids. Or a :class:`MatrixShared`
            that the matrices of one run share: its statistics are built by the first call
            and its dev choices are reused and filled (a row whose vectors and dev facts equal
            an earlier row's is not searched again).
        **score_kw: passed to every scoring call (the protocol's scoring function).

    Returns:
        :class:`TransferMatrix`.
    """
    matrix = matrix or MatrixSettings()
    build = build or BuildSettings()
    split = split or SplitSettings()
    scoring = scoring or ScoringOptions()
    t0 = time.time()
    facts = list(facts)
    relations, langs, held = _axes(facts, by, matrix.held_out, matrix.cells)
    k_shot, build_ids = build.k_shot, matrix.build_ids
    if build_ids is not None and build_ids <= k_shot:
        raise InputError(
            f"build_ids={build_ids}: few-shot prompts of k_shot={k_shot} need at "
            f"least {k_shot + 1} build fact ids per relation"
        )
    m = replace(matrix, layers=tuple(matrix.layers or matrix_layers(int(model.cfg.n_layers))))
    splits = split_facts(facts, split.fractions, salt=split.salt)
    built = balance_relations(splits["build"], build_ids)
    shared = stats if isinstance(stats, MatrixShared) else MatrixShared(stats)
    stats = shared.stats
    if stats is None:
        stats = shared.stats = group_stats(
            model,
            built,
            k_shot=k_shot,
            translation_shots=build.translation_shots,
            batch_size=build.batch_size,
            progress=scoring.progress,
        )
    else:
        _check_stats(stats, built, k_shot, build.translation_shots)
    kw = {
        "decoding": DecodeOptions(
            max_new_tokens=scoring.max_new_tokens, batch_size=scoring.batch_size
        ),
        "metric": scoring.metric,
        **score_kw,
    }
    run = _Run(model, by, m, kw, on_cell, shared.choices, _stats_key(stats, build))
    run.relation_of = {f.id: f.relation for f in facts}
    run.dev = splits["dev"]
    run.tests = {c: _column_test(splits["test"], by, c, m.test_ids) for c in held}
    rows = _rows(by, relations, langs, held, m.cells)
    for row in tqdm(rows, desc="transfer rows", disable=not scoring.progress):
        vectors = group_vectors.pooled_vectors(
            stats,
            relations=row.relations,
            langs=row.langs,
            subtract_zero_shot=build.subtract_zero_shot,
            unit=build.unit,
            model=model,
        )
        run.row(row, vectors)
    axes = {"by": by, "held_out": held, "cells": m.cells, "relations": relations, "langs": langs}
    meta = _matrix_meta(axes, len({f.id for f in built}), m, build, split, scoring, score_kw)
    meta["seconds"] = round(time.time() - t0, 1)
    out = TransferMatrix(by, run.cells, [r.name for r in rows], held, run.choices, meta)
    out.stats = stats
    return out


def _matrix_meta(
    axes: dict[str, Any],
    n_build_ids: int,
    m: MatrixSettings,
    build: BuildSettings,
    split: SplitSettings,
    scoring: ScoringOptions,
    score_kw: dict[str, Any],
) -> dict[str, Any]:
    """The ``meta`` of a :class:`TransferMatrix`: its axes and every setting it ran with."""
    return {
        **axes,
        "build_ids_per_relation": n_build_ids // max(1, len(axes["relations"])),
        "screen_ids": m.screen_ids,
        "dev_ids": m.dev_ids,
        "test_ids": m.test_ids,
        "layers": list(m.layers or ()),
        "alphas": list(m.alphas),
        "top_k": m.top_k,
        "k_shot": build.k_shot,
        "translation_shots": build.translation_shots,
        "unit": build.unit,
        "fractions": list(split.fractions),
        "salt": split.salt,
        "seed": m.seed,
        "controls": m.controls,
        "max_new_tokens": scoring.max_new_tokens,
        "score_kw": {k: repr(v) for k, v in _given(scoring, score_kw).items()},
        "test_items": "non-English test items of the column",
    }


def _given(scoring: ScoringOptions, score_kw: dict[str, Any]) -> dict[str, Any]:
    """The scoring keywords a caller gave (the metric when it is not the default name)."""
    given = {} if scoring.metric == ScoringOptions.metric else {"metric": scoring.metric}
    return {**given, **score_kw}


@dataclass
class TransferMatrices(WritesFolder):
    """The transfer matrices of ``steer eval --transfer`` (:func:`transfer_matrices`): one
    :class:`TransferMatrix` per kind (``"relation"``, ``"lang"``), and ``notes`` for a kind
    the facts cannot give."""

    matrices: dict[str, TransferMatrix]
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """``{"notes": [...], "relation": matrix JSON, "lang": matrix JSON}`` (each
        :meth:`TransferMatrix.to_json`): what ``summary.json`` holds under ``"transfer"``."""
        out: dict[str, Any] = {"notes": list(self.notes)}
        for kind, m in self.matrices.items():
            out[kind] = m.to_json()
        return out

    def files(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``{"summary.json": {"transfer": summary, "meta": meta}}`` (``meta`` when given)."""
        doc: dict[str, Any] = {"transfer": self.summary()}
        if meta is not None:
            doc["meta"] = meta
        return {"summary.json": doc}


def transfer_matrices(
    model: Model,
    facts: Sequence[Fact],
    *,
    by: str = "both",
    matrix: MatrixSettings | None = None,
    built: Mapping[str, Any] | None = None,
    split: SplitSettings | None = None,
    scoring: ScoringOptions | None = None,
) -> TransferMatrices:
    """The transfer matrices of ``steer eval --transfer``: ``by`` relation, language or
    ``"both"`` (one :func:`transfer_matrix` each with ``matrix``, ``split`` and ``scoring``,
    the build statistics shared), with a note for a matrix the facts cannot give (one
    relation; fewer than two languages besides English).

    ``built``: the ``build`` record of the vectors being evaluated (their build settings,
    :meth:`~mechlingo.analyses.recall.settings.BuildSettings.of`, are used; the defaults
    without one).
    """
    matrix = matrix or MatrixSettings()
    split = split or SplitSettings()
    scoring = scoring or ScoringOptions()
    settings = BuildSettings.of(built or {})
    kinds = ["relation", "lang"] if by == "both" else [by]
    out = TransferMatrices({})
    shared = MatrixShared()  # the build statistics and the dev choices of equal rows
    for kind in kinds:
        if kind == "relation" and len({f.relation for f in facts}) < 2:
            out.notes.append(
                "by relation: skipped, the facts have one relation (add --relation all)"
            )
            continue
        if kind == "lang" and len({f.lang for f in facts} - {"en"}) < 2:
            out.notes.append("by language: skipped, it needs English and 2+ other languages")
            continue
        m = transfer_matrix(
            model,
            facts,
            by=kind,
            matrix=matrix,
            build=settings,
            split=split,
            scoring=scoring,
            stats=shared,
        )
        out.matrices[kind] = m
    return out


def _check_stats(stats: GroupStats, build: Sequence[Fact], k_shot: int, shots: int) -> None:
    ids: dict[tuple[str, str], list[str]] = {}
    for f in build:
        ids.setdefault((f.relation, f.lang), []).append(f.id)
    if ids != stats.fact_ids or stats.options != {"k_shot": k_shot, "translation_shots": shots}:
        raise InputError(
            "stats= were built from other facts or options than this call's build split",
            fix="pass the stats of a call with the same facts, fractions, salt, build_ids, "
            "k_shot and translation_shots, or leave stats out",
        )


def _axes(
    facts: Sequence[Fact], by: str, held_out: Sequence[str] | None, cells: str
) -> tuple[list[str], list[str], list[str]]:
    """The relations, languages (English first) and held-out columns, checked."""
    if by not in ("relation", "lang"):
        raise InputError(f'by must be "relation" or "lang", got {by!r}')
    if cells not in ("full", "diagonal"):
        raise InputError(f'cells must be "full" or "diagonal", got {cells!r}')
    relations = [r for r in RELATIONS if r in {f.relation for f in facts}]
    relations += sorted({f.relation for f in facts} - set(relations))
    langs = sorted({f.lang for f in facts}, key=lambda x: (x != "en", x))
    pool = relations if by == "relation" else [x for x in langs if x != "en"]
    held = list(held_out) if held_out is not None else list(pool)
    unknown = [h for h in held if h not in pool]
    if unknown or not held:
        raise InputError(f"held_out {unknown or held} not among the {by}s of the facts: {pool}")
    if by == "relation" and len(relations) < 2:
        raise InputError("a transfer matrix by relation needs facts of at least two relations")
    if by == "lang" and (len(langs) < 3 or "en" not in langs):
        raise InputError("a transfer matrix by language needs English and two other languages")
    return relations, langs, held


class _Run:
    """The rows of one matrix: each row's checks, dev choice and test cells."""

    def __init__(
        self,
        model: Model,
        by: str,
        matrix: MatrixSettings,
        kw: dict[str, Any],
        on_cell: Callable[[dict[str, Any]], None] | None,
        choice_memo: dict[Any, dev_grid.Choice],
        build_key: Any,
    ) -> None:
        self.model, self.by, self.budget, self.kw = model, by, matrix, kw
        self.choice_memo, self.build_key = choice_memo, build_key
        self.seed, self.on_cell = matrix.seed, on_cell
        self.relation_of: dict[str, str] = {}
        self.dev: list[Fact] = []
        self.tests: dict[str, list[Fact]] = {}
        self.orig: dict[str, EvalResult] = {}
        self.cells: list[dict[str, Any]] = []
        self.choices: dict[str, dict[str, Any]] = {}
        self.memo = PrefixMemo()

    def score(
        self, facts: Sequence[Fact], iv: Intervention | None | dict[str, Intervention | None]
    ) -> Any:
        """``facts`` scored under ``iv``, or under every condition of a mapping at once
        (:func:`mechlingo.analyses.recall.dev_grid.score`)."""
        return dev_grid.score(self.model, facts, iv, **self.kw)

    def row(self, row: _Row, vectors: SteeringPair) -> None:
        """Check what the row was built on, choose on its dev facts, score its cells."""
        all_test = [f for t in self.tests.values() for f in t]
        col_test = [f for c in row.cols for f in self.tests[c]]
        check_disjoint(
            f"building the vectors of row {row.name}", vectors.build["fact_ids"], all_test
        )
        _held_out_check(
            "building",
            row,
            ids=vectors.build["fact_ids"],
            langs=vectors.build["langs"],
            relation_of=self.relation_of,
        )
        dev = _row_dev(self.dev, row, self.budget.dev_ids)
        _held_out_check("the dev choice", row, facts=dev)
        check_disjoint(f"the dev choice of row {row.name}", dev, all_test)
        key = (self.build_key, frozenset(row.relations), frozenset(row.langs), tuple(dev),
               _grid_key(self.budget), repr(sorted(self.kw.items())))  # fmt: skip
        choice = self.choice_memo.get(key)
        if choice is None:  # an equal earlier row (same vectors, same dev facts) chose already
            choice = _choose(self.model, vectors, dev, col_test, self.budget, self.kw)
            self.choice_memo[key] = choice
        self.choices[row.name] = {
            "relations": list(row.relations),
            "langs": list(row.langs),
            "n_build_facts": vectors.build["n_facts"],
            "n_dev_items": len(dev),
            **choice.to_json(),
        }
        steered = _steered(vectors, choice.config, choice.selected)
        control = _control(vectors, choice.config, choice.selected, self.seed)
        more = {f"control_{i}": _control(vectors, choice.config, choice.selected,
                                         self.seed + CONTROL_SEED_STEP * i)
                for i in range(1, self.budget.controls)}  # fmt: skip
        for c in row.cols:
            conds = {"steered": steered, "control": control, **more}
            if c not in self.orig:
                conds["orig"] = None
            with reusing_prefixes(self.memo):  # every row scores the same test prompts
                got = self.score(self.tests[c], conds)
            self.orig.setdefault(c, got.get("orig"))  # type: ignore[arg-type]
            s, r = got["steered"], got["control"]
            stats = _cell_stats(self.orig[c], s, r, self.seed, [got[k] for k in more])
            cell = {"row": row.name, "col": c, **stats}
            cell |= {
                "selected": choice.selected,
                "dev_effect": choice.dev_effect,
                "config": choice.config.to_json(),
                **_place(choice.config, choice.selected),
                "built_on": list(row.relations if self.by == "relation" else row.langs),
            }
            self.cells.append(cell)
            if self.on_cell is not None:
                self.on_cell(jsonable(cell))


def _stats_key(stats: GroupStats, build: BuildSettings) -> tuple[Any, ...]:
    """What a row's vectors depend on besides its relations and languages: the build fact ids
    of every group, the statistics' options and the build settings."""
    ids = tuple(sorted((g, tuple(v)) for g, v in stats.fact_ids.items()))
    return ids, repr(sorted(stats.options.items())), repr(build)


def _grid_key(m: MatrixSettings) -> tuple[Any, ...]:
    """The matrix settings a dev choice reads (:func:`_choose`)."""
    return (m.layers, m.alphas, m.top_k, m.screen_ids, m.en_tolerance, m.p_threshold)


def _column_test(test: Sequence[Fact], by: str, col: str, n_ids: int) -> list[Fact]:
    """The non-English test facts of one column, ``n_ids`` ids per relation."""
    if by == "relation":
        sel = [f for f in test if f.relation == col and f.lang != "en"]
    else:
        sel = [f for f in test if f.lang == col]
    sel = balance_relations(sel, n_ids) if sel else sel
    if not sel:
        raise InputError(f"no test facts for column {col!r}; raise the test fraction or --limit")
    return sel


def _row_dev(dev: Sequence[Fact], row: _Row, n_ids: int) -> list[Fact]:
    sel = [f for f in dev if f.relation in row.relations and f.lang in row.langs]
    sel = spread(sel, n_ids)
    if not sel:
        raise InputError(f"row {row.name}: no dev facts of its build relations and languages")
    return sel

"""Circuits of several languages compared (what ``mechlingo circuit`` runs).

:func:`circuits_by_language` keeps, in each language, the facts the model answers correctly
(greedy generation, the eval rule), finds a circuit on the first ``prompts`` of them
(:func:`~mechlingo.analyses.circuits.result.find_circuit`, subject pairs within the language),
then compares every two languages: the edge overlap of their circuits against size-matched
random circuits (:func:`~mechlingo.analyses.circuits.compare.edge_overlap`) and each
language's circuit run on the other's prompt pairs
(:func:`~mechlingo.analyses.circuits.compare.cross_faithfulness`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mechlingo.analyses.circuits.compare import cross_faithfulness, edge_overlap
from mechlingo.analyses.circuits.result import CircuitResult, find_circuit
from mechlingo.core.defaults import BATCH_SIZE, MAX_NEW_TOKENS
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_facts

if TYPE_CHECKING:
    from mechlingo.data import Fact

__all__ = ["LanguageCircuits", "circuits_by_language", "correct_facts"]


@dataclass
class LanguageCircuits:
    """Per-language circuits and their comparison.

    Attributes:
        results: ``{lang: CircuitResult}``.
        answered: ``{lang: {"read", "correct", "used"}}``: facts read, answered correctly,
            and given to :func:`find_circuit` (its pairs may use fewer: ``n`` of each result).
        overlap: ``{a: {b: edge_overlap}}`` for every two languages (``jaccard``,
            ``null_mean``, ``p``, ``n_a``, ``n_b``), both orders.
        cross: ``{circuit language: {prompt language: faithfulness}}`` (``n_edges``,
            ``faithfulness``, ``lo``, ``hi``); the diagonal is each circuit on its own pairs.
        skipped: languages without a circuit and why.
    """

    results: dict[str, CircuitResult]
    answered: dict[str, dict[str, int]]
    overlap: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    cross: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def ns(self) -> dict[str, int]:
        """Facts per language (the circuits' n)."""
        return {lg: r.n for lg, r in self.results.items()}

    def curves(self) -> dict[str, dict[str, Any]]:
        """``{lang: {"n", "total", "curve", "areas"}}`` (JSON-ready)."""
        return {
            lg: {"n": r.n, "total": len(r.ranked), "curve": r.curve, "areas": r.areas}
            for lg, r in self.results.items()
        }

    def curve_rows(self) -> list[dict[str, Any]]:
        """One row per language and curve point (the CSV)."""
        rows = []
        for lg, c in self.curves().items():
            for p in c["curve"]:
                rows.append({"lang": lg, "n_edges": p["n_edges"],
                             "fraction": p["n_edges"] / c["total"], **{k: p[k] for k in
                             ("faithfulness", "lo", "hi")}, "n": c["n"]})  # fmt: skip
        return rows

    def summary(self) -> dict[str, Any]:
        """The headline numbers: per language n, the circuit's size and faithfulness with
        its interval, CPR and CMD, the estimate-vs-exact rank correlation; the overlap and
        the cross-language faithfulness."""
        per = {}
        for lg, r in self.results.items():
            per[lg] = {
                **self.answered.get(lg, {}), "n": r.n, "edges": len(r.circuit),
                "of_edges": len(r.ranked), "faithfulness": r.faithfulness,
                "cpr": r.areas.get("cpr"), "cmd": r.areas.get("cmd"),
                "spearman_top": r.spearman, "clean_mean": float(r.clean.mean()),
                "corrupted_mean": float(r.corrupted.mean()),
            }  # fmt: skip
        return {"languages": per, "overlap": self.overlap, "cross_faithfulness": self.cross,
                "skipped": self.skipped}  # fmt: skip


def correct_facts(
    model: Model, facts: Sequence[Fact], *, batch_size: int, max_new_tokens: int, progress: bool
) -> list[Fact]:
    """The facts the model answers correctly (greedy generation, the eval rule), in order."""
    if not facts:
        return []
    res = evaluate_facts(
        model,
        facts,
        decoding=DecodeOptions(
            batch_size=batch_size, max_new_tokens=max_new_tokens, progress=progress
        ),
    )
    ok = {(r["lang"], r["id"]) for r in res.records if r["correct"]}
    return [f for f in facts if (f.lang, f.id) in ok]


def circuits_by_language(
    model: Model,
    facts: Sequence[Fact],
    *,
    prompts: int = 40,
    max_new_tokens: int = MAX_NEW_TOKENS,
    n_null: int = 2000,
    **circuit: Any,
) -> LanguageCircuits:
    """Per language (in the order of ``facts``): the first ``prompts`` correctly answered
    facts, their circuit (``circuit``: :func:`find_circuit`'s keywords, ``batch_size`` and
    ``progress`` included), then the overlap and cross-language faithfulness of every two.

    A language with fewer than 3 correctly answered facts, or none with a partner, gets no
    circuit (``skipped`` says why); :class:`InputError` when no language has one."""
    progress = bool(circuit.get("progress", False))
    batch_size = int(circuit.get("batch_size", BATCH_SIZE))
    langs = list(dict.fromkeys(f.lang for f in facts))
    results: dict[str, CircuitResult] = {}
    answered: dict[str, dict[str, int]] = {}
    skipped: dict[str, str] = {}
    for lg in langs:
        mine = [f for f in facts if f.lang == lg]
        ok = correct_facts(model, mine, batch_size=batch_size, max_new_tokens=max_new_tokens,
                           progress=progress)  # fmt: skip
        used = ok[:prompts]
        answered[lg] = {"read": len(mine), "correct": len(ok), "used": len(used)}
        if len(used) < 3:
            skipped[lg] = f"{len(ok)} of {len(mine)} facts answered correctly (3 needed)"
            continue
        if progress:
            print(f"circuit {lg}: {len(used)} correctly answered facts", file=sys.stderr)
        try:
            results[lg] = find_circuit(model, used, **circuit)
        except InputError as err:  # no fact with a partner of equal length
            skipped[lg] = str(err)
    if not results:
        raise InputError(
            "no language has a circuit: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()),
            fix="read more facts (--limit) or other languages",
        )
    out = LanguageCircuits(results, answered, skipped=skipped)
    compare_languages(model, out, n_null=n_null)
    return out


def compare_languages(model: Model, lc: LanguageCircuits, *, n_null: int = 2000) -> None:
    """Fill ``lc.overlap`` and ``lc.cross`` (every two languages, both orders)."""
    res = lc.results
    for a, ra in res.items():
        names = [ra.edge_name(e) for e in ra.ranked]
        lc.cross[a] = {a: dict(ra.faithfulness, n_edges=len(ra.circuit))}
        for b, rb in res.items():
            if a == b:
                continue
            if b in lc.overlap and a in lc.overlap[b]:
                o = lc.overlap[b][a]
                lc.overlap.setdefault(a, {})[b] = {**o, "n_a": o["n_b"], "n_b": o["n_a"]}
            else:
                ea = [ra.edge_name(e) for e in ra.circuit]
                eb = [rb.edge_name(e) for e in rb.circuit]
                lc.overlap.setdefault(a, {})[b] = edge_overlap(ea, eb, names, n_null=n_null)
            lc.cross[a][b] = cross_faithfulness(model, ra, rb)


def overlap_cells(
    overlap: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, str]]]:
    """The overlap as a heatmap's values (Jaccard) and cell texts (with p and the null)."""
    vals: dict[str, dict[str, float]] = {}
    text: dict[str, dict[str, str]] = {}
    for a, row in overlap.items():
        for b, o in row.items():
            vals.setdefault(a, {})[b] = o["jaccard"]
            text.setdefault(a, {})[b] = (
                f"{o['jaccard']:.2f} (null {o['null_mean']:.3f}, p = {o['p']:.4f}; "
                f"{int(o['n_a'])} vs {int(o['n_b'])} edges)"
            )
    return vals, text

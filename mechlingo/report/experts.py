"""The reports of ``mechlingo experts`` (expert neurons and the choice of k) and
``mechlingo align`` (cross-lingual alignment before and after a clamp)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mechlingo.report.page import Report
from mechlingo.viz.experts import interval_bars_figure

#: BOS samples of each arm shown in the k-curve examples table.
BOS_EXAMPLES = 6


def experts_report(
    result: Any,
    summary: Mapping[str, Any],
    curves: Mapping[str, Any],
    choices: Mapping[str, Mapping[str, Any]],
    *,
    k_show: int,
    score: str,
) -> Report:
    """The experts report: the best neurons per language (table, layers, overlap at
    ``k_show``) and, per target with a k curve, how k was chosen.

    ``result`` is a :class:`mechlingo.analyses.experts.ExpertResult`, ``summary`` its
    ``summary(k_show)`` with ``meta`` added; ``curves`` the
    :class:`~mechlingo.analyses.experts.KCurve` of each target and ``choices`` their
    ``choose(...)`` records; ``score`` the neuron score (``auroc``, ``ap``, ``lape``).
    """
    report = Report("mechlingo: expert neurons", summary["meta"])
    add_experts_headline(report, summary, score=score)
    for target, curve in curves.items():
        add_k_headline(report, curve, choices[target])
    report.add_text(
        "Each MLP neuron's activation is pooled over each sentence's real tokens and scored "
        f"by {score.upper()} as a detector of one language against the others. The top "
        "k neurons of a language are clamped to their mean (or median) activation on that "
        "language at every position; the control writes the same values to random neurons.",
        note=True,
    )
    report.add_heading("Best neurons")
    report.add_table([{"lang": lg, **v} for lg, v in summary["per_lang"].items()])
    report.add_figure(result.fig_layers(k_show))
    report.add_figure(result.fig_overlap(k_show))
    for target, curve in curves.items():
        add_k_choice(report, curve, choices[target])
    return report


def add_k_choice(report: Report, curve: Any, choice: Mapping[str, Any]) -> None:
    """How k was chosen for one target: the rule, the per-k table, the k curve and
    example generations of every arm."""
    report.add_heading(f"Choosing k for {curve.lang}")
    report.add_text(
        "Generations: temperature-1 samples from a bare BOS prompt (fixed seed; greedy from "
        "BOS gives one string only) and greedy continuations of short neutral prompts; "
        "language identified by py3langid among the languages of the data. Rate intervals: "
        "Wilson 95%; perplexity intervals: bootstrap 95% over the held-out lines."
    )
    report.add_text(
        f"Rule: {choice['rule']}. Chosen: "
        + (f"k = {choice['k']}." if choice["k"] is not None else "none (no k within the budget).")
    )
    report.add_table(k_rows(curve, choice))
    report.add_figure(curve.fig_k_curve(choice["k"]))
    report.add_table(example_rows(curve))


def example_rows(curve: Any) -> list[dict[str, Any]]:
    """Every arm's first BOS samples and all its prompt continuations."""
    rows = []
    for r in curve.rows:
        bos = [x for x in r["examples"] if x["source"] == "BOS"][:BOS_EXAMPLES]
        prompted = [x for x in r["examples"] if x["source"] != "BOS"]
        rows += [{"k": r["k"], "arm": r["arm"], **e} for e in bos + prompted]
    return rows


def _with_ci(r: Mapping[str, Any], col: str, fmt: str = ".2f") -> str:
    lo, hi = r.get(f"{col}_lo"), r.get(f"{col}_hi")
    band = f" [{lo:{fmt}}, {hi:{fmt}}]" if lo is not None and hi is not None else ""
    return f"{r[col]:{fmt}}{band}"


def k_rows(curve: Any, choice: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per k for the report: rate of experts and control with intervals, perplexity
    ratios, within budget, chosen, McNemar p against no clamp and against the control."""
    lang = curve.lang
    tests = {t["k"]: t for t in curve.tests()}
    by = {(r["k"], r["arm"]): r for r in curve.rows}
    rows: list[dict[str, Any]] = []
    none = by.get((0, "none"))
    if none is not None:
        rows.append({"k": 0, "experts: rate in " + lang: _with_ci(none, "target_rate_bos")})
    for cand in choice["candidates"]:
        k = cand["k"]
        e, ctl = by[(k, "experts")], by.get((k, "random"))
        t = tests.get(k, {})
        rows.append(
            {
                "k": k,
                "experts: rate in " + lang: _with_ci(e, "target_rate_bos"),
                "control: rate": _with_ci(ctl, "target_rate_bos") if ctl else "",
                f"experts: ppl ratio {lang}": _with_ci(e, f"ppl_ratio_{lang}"),
                "experts: ppl ratio others": cand["ppl_ratio_others"],
                f"control: ppl ratio {lang}": _with_ci(ctl, f"ppl_ratio_{lang}") if ctl else "",
                "within budget": cand["within_budget"],
                "chosen": k == choice["k"],
                "p vs none": t.get("vs_none", {}).get("p"),
                "p vs control": t.get("vs_random", {}).get("p"),
            }
        )
    return rows


# --------------------------------------------------------------------------------------


def align_report(
    comp: Any, summary: Mapping[str, Any], side: Any = None, *, layer: int | None = None
) -> Report:
    """The alignment report: headline numbers with intervals, retrieval per layer and as a
    matrix, distances and their PCA, and the clamp's side effects (when measured).

    ``comp`` is a :class:`mechlingo.analyses.experts.align.AlignmentComparison`; ``summary`` its
    ``summary(layer)`` with ``intervals`` (``comp.intervals(layer)``) and ``meta`` added;
    ``side`` a :func:`mechlingo.scoring.side_effects.side_effects` result or ``None``;
    ``layer`` the layer of the matrix and PCA figures (``--layer``; default the last).
    """
    report = Report("mechlingo: cross-lingual alignment", summary["meta"])
    add_align_headline(report, summary)
    report.add_text(
        "Sentence embedding = mean residual stream over real tokens (BOS excluded). Retrieval "
        "a->b: fraction of sentences of a whose nearest neighbour (cosine) among b's sentences "
        f"is its translation (chance {1 / comp.pre.emb.shape[2]:.3f}). Distances are mean "
        "cosine distances; 'different sentences' is the baseline that translations should "
        "beat.",
        note=True,
    )
    report.add_heading("Headline numbers with 95% intervals")
    report.add_text(
        "Means over sentences with bootstrap intervals (resampling sentences; for retrieval "
        "the queries, with the candidate pool fixed). Gains are paired over the same "
        "sentences; for distances a negative gain means closer. 'control' is the random-"
        "neuron clamp of the same size and values."
    )
    report.add_table(interval_rows(summary["intervals"]))
    report.add_figure(
        interval_bars_figure(
            summary["intervals"]["measures"], f"layer {summary['layer']}: means with 95% CIs"
        )
    )
    report.add_heading("Retrieval per layer")
    report.add_figure(comp.fig_layers())
    report.add_heading("Retrieval matrix")
    report.add_figure(comp.fig_retrieval(layer))
    report.add_heading("Distances")
    report.add_table([{"arm": k, **v} for k, v in summary["distance"].items()])
    report.add_figure(comp.fig_pca(layer))
    if side is not None:
        report.add_heading("Side effects of the clamp in every language")
        report.add_figure(side.fig_heatmap())
    return report


def _mean_ci(c: Mapping[str, Any]) -> str:
    v, lo, hi = c.get("estimate"), c.get("lo"), c.get("hi")
    if v is None:
        return ""
    return f"{v:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def interval_rows(iv: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per measure the mean [lo, hi] of every arm and the gains with intervals."""
    rows = []
    for m, per in iv["measures"].items():
        row: dict[str, Any] = {"measure": m}
        row |= {arm: _mean_ci(c) for arm, c in per.items()}
        row |= {name: _mean_ci(g) for name, g in iv["gains"].get(m, {}).items()}
        rows.append(row)
    return rows


def add_experts_headline(report: Report, summary: Mapping[str, Any], *, score: str) -> None:
    """The best neuron's AUROC per language and the mean overlap of the top sets."""
    per = summary["per_lang"]
    report.add_headline(f"Best neuron's AUROC per language (scored by {score})",
                        ", ".join(f"{lg} {v['auroc_top1']:.3f}" for lg, v in per.items()))  # fmt: skip
    ov = summary.get("mean_overlap_between_langs")
    if isinstance(ov, float) and ov == ov:
        report.add_headline(f"Mean overlap of the top {summary['k']} between languages",
                            f"{ov:.3f}")  # fmt: skip


def add_k_headline(report: Report, curve: Any, choice: Mapping[str, Any]) -> None:
    """The k chosen for one target, with the rate in the target language of the experts'
    clamp against the random-neuron control (Wilson intervals)."""
    k = choice["k"]
    if k is None:
        report.add_headline(f"k for {curve.lang}", "none within the budget")
        return
    by = {(r["k"], r["arm"]): r for r in curve.rows}
    e, ctl = by.get((k, "experts")), by.get((k, "random"))
    rate = _with_ci(e, "target_rate_bos") if e else "n/a"
    ctrl = f"; control {_with_ci(ctl, 'target_rate_bos')}" if ctl else ""
    report.add_headline(f"k = {k} for {curve.lang}: rate in {curve.lang}", rate + ctrl)


def add_align_headline(report: Report, summary: Mapping[str, Any]) -> None:
    """At the reported layer: retrieval before the clamp, the clamp's gain and the
    control's gain (bootstrap intervals over sentences)."""
    iv = summary["intervals"]
    n = iv.get("n_sentences")
    report.add_headline("Layer, sentences", f"{summary['layer']}, {n} per language")
    pre = iv["measures"].get("retrieval", {}).get("pre", {})
    report.add_headline("Retrieval (top-1), no clamp", _mean_ci(pre))
    for name, label in (("post_vs_pre", "Effect: clamp vs none"),
                        ("control_vs_pre", "Control: random clamp vs none")):  # fmt: skip
        g = iv["gains"].get("retrieval", {}).get(name)
        if g is not None:
            report.add_headline(f"{label}, retrieval gain", _mean_ci(g))

"""The papers' claims, the fixed rules that turn measurements into verdicts, and the card.

Every claim of Lu et al. (EMNLP 2025) and Sundar et al. (ACL 2025) that mechlingo checks is a
:class:`Claim`; :func:`mechlingo.analyses.replicate.replicate` measures each on a model and
hands the numbers to :func:`judge`, which applies the claim's rule. The rules were fixed in
this module (and ``docs/replicate.md``) before any run, and no run changes them:

* **effect claims** (``kind="effect"``): ``holds`` when the 95% interval of the effect lies
  beyond the claim's threshold in the paper's direction (above it for ``direction=+1``,
  below for ``-1``) *and* the control's 95% interval does not lie beyond the control's
  threshold in that same direction; ``does not hold`` otherwise.
* **null claims** (``kind="null"``, e.g. "a random vector does not raise accuracy"):
  ``holds`` when the 95% interval of the effect does *not* lie beyond the threshold in the
  named direction; ``does not hold`` when it does.
* ``not testable here`` when the measurement could not be made (the reason is given: no
  headroom, no k within the perplexity budget, a zero baseline, too few items), and a stage
  that failed leaves its row with ``verdict = "error"`` and the error message.

An interval that merely straddles the threshold is ``does not hold`` for an effect claim: the
card says what the data *show*, and the row gives the interval and n, so a reader sees
whether the data were too few.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from mechlingo.kernels.significance import mcnemar

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CLAIMS",
    "HOLDS",
    "NOT_HOLDS",
    "NOT_TESTABLE",
    "Claim",
    "ClaimsCard",
    "Interval",
    "RULES",
    "error_row",
    "headroom_lowest_language",
    "judge",
]

HOLDS = "holds"
NOT_HOLDS = "does not hold"
NOT_TESTABLE = "not testable here"
ERROR = "error"

#: The verdict rules in words (written into claims.json and the report).
RULES = {
    "effect": "holds when the 95% interval of the effect lies beyond the threshold in the "
    "paper's direction and the control's 95% interval does not lie beyond the control "
    "threshold in that direction; otherwise does not hold",
    "null": "holds when the 95% interval of the effect does not lie beyond the threshold in "
    "the named direction (no detectable effect); does not hold when it does",
    "not testable here": "the measurement could not be made on this model and data (the "
    "reason is given)",
    "error": "the stage that measures the claim failed; the row carries its error",
}


@dataclass(frozen=True)
class Claim:
    """One claim: what the paper says, what mechlingo measures, and the rule's parameters.

    ``direction`` +1: the effect must be above ``threshold`` (-1: below). ``figure`` is the
    anchor of the report section that shows it.
    """

    id: str
    paper: str
    text: str
    paper_number: str
    measure: str
    stage: str
    figure: str
    kind: Literal["effect", "null"] = "effect"
    direction: int = 1
    threshold: float = 0.0
    control_threshold: float = 0.0


LU = "lu2025"
SUNDAR = "sundar2025"

CLAIMS: tuple[Claim, ...] = (
    Claim(
        "latent_english",
        LU,
        "The English answer is decodable in the middle layers before the target-language "
        "answer (latent-language curves).",
        "qualitative: English is the latent language of recall (Fig. 2-3)",
        "share of non-English queries (English answer != L answer, one of them reaches rank "
        "<= 10 before the output) whose English answer reaches it at an earlier layer; "
        "Wilson 95% CI; threshold 0.5",
        "trace",
        "fig-latent",
        threshold=0.5,
    ),
    Claim(
        "recall_failures",
        LU,
        "Most errors are recall failures rather than translation failures (the tracer).",
        "recall failures are the majority of errors",
        "recall failures / (recall + translation failures) over the non-English errors of the "
        "tracer; Wilson 95% CI; threshold 0.5",
        "trace",
        "fig-classes",
        threshold=0.5,
    ),
    Claim(
        "task_vector",
        LU,
        "The recall-engagement vector raises accuracy.",
        "raises recall accuracy (task vector, mid layers)",
        "test gain of 'task' over 'orig' on the non-English items (paired bootstrap 95% CI); "
        "control: the norm-matched random vectors (each seed)",
        "repair",
        "fig-repair",
    ),
    Claim(
        "diff_vector",
        LU,
        "The back-translation vector raises accuracy.",
        "raises recall accuracy (translation difference vector, late layers)",
        "test gain of 'diff' over 'orig' on the non-English items (paired bootstrap 95% CI); "
        "control: the norm-matched random vectors (each seed)",
        "repair",
        "fig-repair",
    ),
    Claim(
        "lowest_language",
        LU,
        "Both together raise the lowest-performing language by more than 35% (relative).",
        "> +35% relative, lowest-performing language",
        "relative test gain of 'both' over 'orig' in the language of the headroom rule "
        "(lowest dev zero-shot among non-English languages whose dev few-shot beats zero-shot, "
        "exact McNemar p < 0.1); bootstrap 95% CI; threshold +0.35; control: random vectors",
        "repair",
        "fig-headroom",
        threshold=0.35,
    ),
    Claim(
        "independent_relations",
        LU,
        "The vectors are independent of relations (the transfer matrix, by relation).",
        "independent of language and dataset",
        "gain of vectors built without relation R, tested on R (rows all_but_<R>); holds "
        "when the median cell's interval excludes 0 upward and no cell's random control does",
        "transfer_relation",
        "fig-transfer",
    ),
    Claim(
        "independent_languages",
        LU,
        "The vectors are independent of languages (the transfer matrix, by language).",
        "independent of language and dataset",
        "gain of vectors built without language L, tested on L (rows all_but_<L>); the same rule",
        "transfer_lang",
        "fig-transfer",
    ),
    Claim(
        "random_vector",
        LU,
        "A norm-matched random vector does not raise accuracy.",
        "no gain (control)",
        "test gain of the random vectors (all seeds pooled, paired with orig) on the "
        "non-English items; bootstrap 95% CI",
        "repair",
        "fig-repair",
        kind="null",
    ),
    Claim(
        "experts_exist",
        SUNDAR,
        "Expert neurons exist: AUROC well above 0.5.",
        "AUROC > 0.5 qualifies; top experts near 1",
        "held-out AUROC (sentences not used to select) of the target's top-k experts, median "
        "over the k neurons, bootstrap 95% CI over sentences; threshold 0.5; control: k "
        "random neurons",
        "experts",
        "fig-experts",
        threshold=0.5,
        control_threshold=0.5,
    ),
    Claim(
        "experts_disjoint",
        SUNDAR,
        "The expert sets of different languages barely overlap.",
        "barely overlap",
        "mean share of shared neurons between the top-k sets of two languages (all pairs); "
        "Wilson 95% CI over the pairs' k slots; holds below 0.10",
        "experts",
        "fig-overlap",
        direction=-1,
        threshold=0.10,
    ),
    Claim(
        "clamp_steers",
        SUNDAR,
        "At the k that the papers' rule picks, the clamp steers generation into the target "
        "language.",
        "k chosen by target-language rate against perplexity (k = 100-2000)",
        "gain of the target-language rate of bare-BOS samples, clamp vs no clamp at the k of "
        "the papers' rule (target rate, target perplexity <= 2x); paired bootstrap 95% CI; "
        "control: the random-neuron clamp of the same k",
        "experts",
        "fig-kcurve",
    ),
    Claim(
        "clamp_closer",
        SUNDAR,
        "The clamp brings languages closer (distances before and after; same-sentence / "
        "different-sentence ratio).",
        "cosine distance between languages 0.72 -> 0.19 (Aya-23-8B), 0.72 -> 0.17 (BLOOM-7B)",
        "change of the mean cosine distance between languages (same sentence), post - pre, "
        "per-sentence paired bootstrap 95% CI; direction: down; control: the random clamp",
        "align",
        "fig-align",
        direction=-1,
    ),
    Claim(
        "retrieval_improves",
        SUNDAR,
        "Retrieval improves: before, after, and the random control.",
        "median top-1 gain +32% (Aya), +14% (BLOOM)",
        "change of mean top-1 retrieval over all ordered language pairs, post - pre, paired "
        "bootstrap 95% CI over sentences; control: the random clamp",
        "align",
        "fig-align",
    ),
    Claim(
        "random_neurons",
        SUNDAR,
        "The same values written into random neurons do not help.",
        "no gain (control)",
        "change of mean top-1 retrieval, random clamp - pre, paired bootstrap 95% CI",
        "align",
        "fig-align",
        kind="null",
    ),
)


def claim_by_id(cid: str) -> Claim:
    """The :class:`Claim` with id ``cid``."""
    for c in CLAIMS:
        if c.id == cid:
            return c
    raise KeyError(cid)


# --------------------------------------------------------------------------------------
# Intervals and the rule
# --------------------------------------------------------------------------------------


@dataclass
class Interval:
    """An estimate with its 95% interval and the number of items behind it."""

    estimate: float | None
    lo: float | None
    hi: float | None
    n: int

    @classmethod
    def of(cls, d: Mapping[str, Any] | None, est: str = "gain", n: str = "n") -> Interval | None:
        """From a result dict (``paired_gain``: ``gain``/``lo``/``hi``/``n``; ``wilson``:
        ``est="p"``; ``bootstrap_mean``: ``est="mean"``); ``None`` when absent."""
        if not d:
            return None
        return cls(_num(d.get(est)), _num(d.get("lo")), _num(d.get("hi")), int(d.get(n) or 0))

    @property
    def complete(self) -> bool:
        return self.estimate is not None and self.lo is not None and self.hi is not None

    def beyond(self, threshold: float, direction: int) -> bool:
        """Whether the whole interval lies beyond ``threshold`` in ``direction``."""
        if not self.complete:
            return False
        return self.lo > threshold if direction > 0 else self.hi < threshold  # type: ignore[operator]

    def text(self, digits: int = 3) -> str:
        if self.estimate is None:
            return "n/a"
        f = f"{{:.{digits}f}}"
        ci = "" if self.lo is None else f" [{f.format(self.lo)}, {f.format(self.hi)}]"
        return f"{f.format(self.estimate)}{ci} (n={self.n})"

    def to_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "lo": self.lo, "hi": self.hi, "n": self.n}


def _num(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def judge(
    claim: Claim,
    effect: Interval | None,
    control: Interval | None = None,
    *,
    untestable: str | None = None,
) -> tuple[str, str]:
    """The verdict of ``claim`` and its reason, by the claim's fixed rule (module docstring).

    ``untestable``: a reason the measurement could not be made (then ``not testable here``).
    """
    if untestable:
        return NOT_TESTABLE, untestable
    if effect is None or not effect.complete or effect.n == 0:
        return NOT_TESTABLE, "no interval could be computed (no items)"
    d, t = claim.direction, claim.threshold
    side = "above" if d > 0 else "below"
    if claim.kind == "null":
        if effect.beyond(t, d):
            return NOT_HOLDS, f"the 95% interval lies {side} {t:g}: there is an effect"
        return HOLDS, f"the 95% interval does not lie {side} {t:g}: no detectable effect"
    if not effect.beyond(t, d):
        return NOT_HOLDS, f"the effect's 95% interval does not lie {side} {t:g}"
    if control is not None and control.beyond(claim.control_threshold, d):
        return NOT_HOLDS, (
            f"the effect lies {side} {t:g}, but so does the control's interval "
            f"({side} {claim.control_threshold:g})"
        )
    tail = "" if control is None else "; the control's does not"
    return HOLDS, f"the effect's 95% interval lies {side} {t:g}{tail}"


def make_row(
    claim: Claim,
    effect: Interval | None,
    control: Interval | None = None,
    *,
    untestable: str | None = None,
    details: str = "",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A card row: the claim, the paper's number, mechlingo's number, the verdict."""
    verdict, reason = judge(claim, effect, control, untestable=untestable)
    return {
        "id": claim.id,
        "paper": claim.paper,
        "claim": claim.text,
        "paper_number": claim.paper_number,
        "measure": claim.measure,
        "value": None if effect is None else effect.to_dict(),
        "value_text": "n/a" if effect is None else effect.text(),
        "control": None if control is None else control.to_dict(),
        "control_text": "" if control is None else control.text(),
        "verdict": verdict,
        "reason": reason,
        "details": details,
        "figure": claim.figure,
        "stage": claim.stage,
        "error": None,
        **dict(extra or {}),
    }


def error_row(claim: Claim, error: str) -> dict[str, Any]:
    """The row of a claim whose stage failed: it carries the error."""
    row = make_row(claim, None)
    row.update(verdict=ERROR, reason=f"the stage '{claim.stage}' failed", error=error)
    return row


# --------------------------------------------------------------------------------------
# The headroom rule (issue 21) for the lowest-performing language
# --------------------------------------------------------------------------------------


def headroom_lowest_language(
    outcomes: Mapping[str, tuple[Sequence[bool], Sequence[bool]]], *, p_threshold: float = 0.1
) -> dict[str, Any]:
    """The lowest-performing language *with headroom*: among the non-English languages whose
    dev few-shot accuracy beats their dev zero-shot accuracy (more items fixed than broken,
    exact McNemar ``p < p_threshold`` on the paired items), the one with the lowest dev
    zero-shot accuracy (ties: the higher few-shot accuracy, then the code).

    Args:
        outcomes: ``{lang: (zero_shot, few_shot)}``, per-item correctness paired by item.

    Returns:
        ``{"lang"``: the language or ``None`` when none has headroom; ``"tests"``: per
        language zero- and few-shot accuracy, n and the McNemar test; ``"rule"``: in words``}``.
    """
    tests: dict[str, Any] = {}
    eligible = []
    for lg, (zero, few) in sorted(outcomes.items()):
        if lg == "en" or not zero:
            continue
        if len(zero) != len(few):
            raise ValueError(f"{lg}: {len(zero)} zero-shot and {len(few)} few-shot outcomes")
        t = mcnemar(list(zero), list(few))
        z, f = sum(zero) / len(zero), sum(few) / len(few)
        ok = t["p"] < p_threshold and t["fixed"] > t["broken"]
        tests[lg] = {"zero_shot": z, "few_shot": f, "n": len(zero), **t, "headroom": ok}
        if ok:
            eligible.append((z, -f, lg))
    lang = min(eligible)[2] if eligible else None
    return {
        "lang": lang,
        "tests": tests,
        "rule": "among non-English languages whose dev few-shot accuracy beats zero-shot "
        f"(exact McNemar p < {p_threshold:g}, more fixed than broken), the lowest dev "
        "zero-shot accuracy",
    }


# --------------------------------------------------------------------------------------
# The card
# --------------------------------------------------------------------------------------

_VERDICT_COLOUR = {HOLDS: "#2a7", NOT_HOLDS: "#c33", NOT_TESTABLE: "#888", ERROR: "#d80"}


@dataclass
class ClaimsCard:
    """The verdict of every claim on one model and data.

    ``rows``: one dict per claim (``id``, ``paper``, ``claim``, ``paper_number``, ``value``
    with ``estimate``/``lo``/``hi``/``n``, ``control``, ``verdict``, ``reason``, ``figure``,
    ``error``...). ``stages``: each stage's stored result (the numbers behind the rows and the
    figures) or ``{"error": ...}``. ``meta``: model, budget, settings, timings.
    """

    rows: list[dict[str, Any]]
    stages: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def verdicts(self) -> dict[str, str]:
        """``{claim id: verdict}``."""
        return {r["id"]: r["verdict"] for r in self.rows}

    def to_json(self) -> dict[str, Any]:
        """``claims.json``: the rules, the rows and the run's metadata."""
        return {"meta": self.meta, "rules": RULES, "claims": self.rows}

    def to_dataframe(self) -> pd.DataFrame:
        """One row per claim: paper, claim, paper's number, mechlingo's estimate, lo, hi, n,
        control, verdict, reason."""
        import pandas as pd

        recs = []
        for r in self.rows:
            v = r.get("value") or {}
            recs.append(
                {
                    "id": r["id"],
                    "paper": r["paper"],
                    "claim": r["claim"],
                    "paper_number": r["paper_number"],
                    "estimate": v.get("estimate"),
                    "lo": v.get("lo"),
                    "hi": v.get("hi"),
                    "n": v.get("n"),
                    "control": r.get("control_text", ""),
                    "verdict": r["verdict"],
                    "reason": r["error"] or r["reason"],
                }
            )
        return pd.DataFrame(recs)

    def to_markdown(self) -> str:
        """``claims.md``: the verdict table."""
        head = "| paper | claim | paper's number | mechlingo (95% CI, n) | control | verdict |\n"
        head += "|---|---|---|---|---|---|\n"
        lines = []
        for r in self.rows:
            why = r["error"] or r["reason"]
            cells = [r["paper"], r["claim"], r["paper_number"], r["value_text"],
                     r.get("control_text") or "", f"**{r['verdict']}** ({why})"]  # fmt: skip
            lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
        meta = ", ".join(f"{k}: {self.meta[k]}" for k in ("model", "budget") if k in self.meta)
        return f"# Claims card\n\n{meta}\n\n" + head + "\n".join(lines) + "\n"

    def table_html(self, link: bool = True) -> str:
        """The verdict table as HTML (links to the report's figures with ``link``)."""
        th = "".join(f"<th>{h}</th>" for h in ("paper", "claim", "paper's number",
                     "mechlingo (95% CI, n)", "control", "verdict", "why", "figure"))  # fmt: skip
        body = []
        for r in self.rows:
            col = _VERDICT_COLOUR.get(r["verdict"], "#222")
            fig = f"<a href='#{r['figure']}'>figure</a>" if link else html.escape(r["figure"])
            why = html.escape(r["error"] or r["reason"])
            body.append(
                "<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in (
                    r["paper"], r["claim"], r["paper_number"], r["value_text"],
                    r.get("control_text") or ""))
                + f"<td style='color:{col};font-weight:bold'>{html.escape(r['verdict'])}</td>"
                f"<td>{why}</td><td>{fig}</td></tr>"
            )  # fmt: skip
        return f"<table class='claims'><tr>{th}</tr>{''.join(body)}</table>"

    def _repr_html_(self) -> str:
        n = len(self.rows)
        counts = {v: sum(r["verdict"] == v for r in self.rows) for v in _VERDICT_COLOUR}
        summary = ", ".join(f"{k}: {v}" for k, v in counts.items() if v)
        return (
            f"<b>ClaimsCard</b> ({html.escape(str(self.meta.get('model', '?')))}, budget "
            f"{html.escape(str(self.meta.get('budget', '?')))}): {n} claims; {summary}"
            + self.table_html(link=False)
        )


def _md(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")

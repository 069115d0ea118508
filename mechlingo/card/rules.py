"""The papers' claims, the frozen rules that turn measurements into verdicts, and the card.

Every claim of Lu et al. (EMNLP 2025) and Sundar et al. (ACL 2025) that mechlingo checks is a
:class:`Claim`; :func:`mechlingo.card.replicate.replicate` measures each on a model, makes
its row with :func:`make_row` from :class:`~mechlingo.kernels.significance.Test` objects
(clustered intervals, exact paired p-values, minimum detectable effects) and calls
:func:`finalize` once on all rows: Holm's correction over the card, then each row's verdict
by :data:`RULES` with its adjusted p. There are four verdicts:

* ``holds``: the adjusted p < 0.05, the 95% interval lies beyond the claim's threshold in the
  paper's direction, and (where there is a control) the effect - control interval lies
  beyond 0 in that direction. For a null claim ("a random vector does not raise accuracy"):
  the interval lies short of the margin's edge (``threshold + direction * margin``) and the
  equivalence test at that edge has adjusted p < 0.05.
* ``does not hold``: the interval lies on the other side of the threshold (an effect claim),
  or the effect lies on the other side of its control; for a null claim, the interval lies
  beyond the threshold (there is an effect).
* ``inconclusive``: anything in between (the interval straddles the threshold, or the
  adjusted p is not below 0.05); the row gives the minimum detectable effect.
* ``not testable here``: the measurement cannot be made (the reason is given); ``error``: the
  stage failed.

The rules and every claim's parameters are hashed (:data:`RULES_HASH`) into ``claims.json``;
a change after a card was seen is logged in ``docs/replicate.md``.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from mechlingo.card.statistics import Test, holm
from mechlingo.kernels.significance import Interval

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ALPHA",
    "CLAIMS",
    "HOLDS",
    "INCONCLUSIVE",
    "NOT_HOLDS",
    "NOT_TESTABLE",
    "RULES",
    "RETAINED_SHARE",
    "RULES_HASH",
    "VERDICTS",
    "Claim",
    "ClaimsCard",
    "claim_by_id",
    "error_row",
    "finalize",
    "make_row",
    "rules_hash",
    "verdict",
]

HOLDS = "holds"
NOT_HOLDS = "does not hold"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable here"
ERROR = "error"
VERDICTS = (HOLDS, NOT_HOLDS, INCONCLUSIVE, NOT_TESTABLE)
#: The level of every row's test, after Holm's correction over the card.
ALPHA = 0.05
#: The independence claims' second reading: vectors built without R keep more than this
#: share of the in-pool gain on R (mechlingo's reading; the paper gives no number).
RETAINED_SHARE = 0.5

#: The verdict rules in words (written into claims.json and the report; hashed).
RULES = {
    "holds": "Holm-adjusted p < 0.05, the effect's 95% interval beyond the threshold in the "
    "paper's direction, and the effect - control 95% interval beyond 0 in that direction "
    "(where there is a control)",
    "does not hold": "the effect's 95% interval lies on the other side of the threshold, or "
    "the effect - control interval on the other side of 0",
    "inconclusive": "neither: the interval straddles the threshold or the adjusted p is not "
    "below 0.05; the row gives the minimum detectable effect (80% power, alpha 0.05)",
    "null claims": "holds when the interval lies short of threshold + direction * margin and "
    "the two-sided test of H0 effect = that edge has adjusted p < 0.05 (equivalence); does not "
    "hold when the interval lies beyond the threshold; inconclusive otherwise",
    "p-values": "cluster sign-flip permutation tests (exact McNemar for unclustered 0/1 pairs) "
    "of H0 effect = threshold; with a control, the larger of the effect's p and the "
    "effect - control p (both must hold)",
    "Holm": "Holm's step-down correction over every row of the card that has a p",
    "clusters": "items of one fact (its languages) or one sentence are resampled and "
    "sign-flipped together; controls are pooled over seeds per item",
    "independence": "two rows per claim: the pooled held-out (all_but_R on R) gain, clustered "
    "by fact, against its random control; and the retained share, held-out gain over the "
    "in-pool (all) gain on the same items, above 0.5 (not testable when the in-pool gain is "
    "not above 0)",
    "lowest language": "the literal rule (lowest dev zero-shot accuracy among non-English "
    "languages) and the headroom rule (the same among those whose dev few-shot beats "
    "zero-shot, McNemar p < 0.1), fixed on dev; tied languages are judged on their pooled "
    "test items",
    "not testable here": "the measurement could not be made on this model and data (the "
    "reason is given)",
    "error": "the stage that measures the claim failed; the row carries its error",
}


@dataclass(frozen=True)
class Claim:
    """One claim: what the paper says, what mechlingo measures, and the rule's parameters.

    ``direction`` +1: the effect must be above ``threshold`` (-1: below). ``margin``: for a
    null claim, how far in ``direction`` an effect may go and still count as none. ``figure``
    is the anchor of the report section that shows it.
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
    margin: float | None = None

    @property
    def null_value(self) -> float:
        """The value of H0 that the effect's p tests: the threshold (an effect claim) or the
        margin's edge ``threshold + direction * margin`` (a null claim)."""
        if self.kind == "null":
            return self.threshold + self.direction * (self.margin or 0.0)
        return self.threshold


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
        "clustered by fact; threshold 0.5",
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
        "tracer; clustered by fact; threshold 0.5",
        "trace",
        "fig-classes",
        threshold=0.5,
    ),
    Claim(
        "task_vector",
        LU,
        "The recall-engagement vector raises accuracy.",
        "raises recall accuracy (task vector, mid layers)",
        "test gain of 'task' over 'orig' on the non-English items, clustered by fact; "
        "control: the norm-matched random vectors pooled over seeds; judged against it",
        "repair",
        "fig-repair",
    ),
    Claim(
        "diff_vector",
        LU,
        "The back-translation vector raises accuracy.",
        "raises recall accuracy (translation difference vector, late layers)",
        "test gain of 'diff' over 'orig' on the non-English items, clustered by fact; "
        "control: the norm-matched random vectors pooled over seeds; judged against it",
        "repair",
        "fig-repair",
    ),
    Claim(
        "lowest_language",
        LU,
        "Both together raise the lowest-performing language by more than 35%.",
        "> +35%, lowest-performing language",
        "test gain of 'both' over 'orig' in the lowest language(s) of the literal rule (lowest "
        "dev zero-shot accuracy, non-English) and of the headroom rule (the same among those "
        "whose dev few-shot beats zero-shot, McNemar p < 0.1), tied languages pooled; each "
        "relative (clustered log ratio, when the baseline is above 0) and in points; "
        "threshold 0.35; control: random vectors, judged against it",
        "repair",
        "fig-headroom",
        threshold=0.35,
    ),
    Claim(
        "independent_relations",
        LU,
        "The vectors are independent of relations (the transfer matrix, by relation).",
        "independent of language and dataset",
        "gain of vectors built without relation R, tested on R (rows all_but_<R>), pooled over "
        "the held-out cells and clustered by fact, against the random control; and the share "
        "of the in-pool (all) gain on R that they keep (> 0.5)",
        "transfer_relation",
        "fig-transfer",
    ),
    Claim(
        "independent_languages",
        LU,
        "The vectors are independent of languages (the transfer matrix, by language).",
        "independent of language and dataset",
        "gain of vectors built without language L, tested on L (rows all_but_<L>), pooled and "
        "clustered by fact, against the random control; and the retained share (> 0.5)",
        "transfer_lang",
        "fig-transfer",
    ),
    Claim(
        "random_vector",
        LU,
        "A norm-matched random vector does not raise accuracy.",
        "no gain (control)",
        "test gain of the random vectors (seeds pooled per item, paired with orig) on the "
        "non-English items, clustered by fact; holds when it lies below +0.05 (the margin)",
        "repair",
        "fig-repair",
        kind="null",
        margin=0.05,
    ),
    Claim(
        "experts_exist",
        SUNDAR,
        "Expert neurons exist: AUROC well above 0.5.",
        "AUROC > 0.5 qualifies; top experts near 1",
        "held-out AUROC (sentences not used to select) of the target's top-k experts at the "
        "clamp's k, median over the k neurons; sentences (all translations) resampled "
        "together, permutation p; threshold 0.5; control: k random neurons, judged against it",
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
        "mean share of shared neurons between the top-k sets (the clamp's k) of two languages "
        "(all pairs); delete-one-language jackknife t interval (languages are the units); "
        "holds below 0.10",
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
        "the papers' rule (target rate, target perplexity <= 2x), measured on fresh BOS "
        "samples (not those that chose k), exact paired test; control: the random-neuron "
        "clamp of the same k, judged against it",
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
        "paired per sentence (sign-flip p, bootstrap CI); direction: down; control: the "
        "random clamp, judged against it",
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
        "per sentence; control: the random clamp, judged against it",
        "align",
        "fig-align",
    ),
    Claim(
        "random_neurons",
        SUNDAR,
        "The same values written into random neurons do not help.",
        "no gain (control)",
        "change of mean top-1 retrieval, random clamp - pre, paired per sentence; holds when "
        "it lies below +0.05 (the margin)",
        "align",
        "fig-align",
        kind="null",
        margin=0.05,
    ),
    # ---- issue 33: the claims the first card left out (mechlingo.card.lu/_sundar)
    Claim(
        "english_gap",
        LU,
        "English is answered more accurately than the other languages (the baseline gap).",
        "English accuracy well above the other languages' (Fig. 1)",
        "test accuracy (P@1 under --metric rank) of English minus that of each other language "
        "on the same facts, no intervention; paired, clustered by fact",
        "repair",
        "fig-repair",
    ),
    *(
        Claim(
            f"latent_english_{dec}",
            LU,
            f"Under the {label}, the English answer is decodable before the target-language "
            "answer.",
            "English is the latent language (logit lens); docs/methods/logit-lens.md: the "
            "pivot does not survive the patchscope for ru/zh/ja",
            f"share of non-English test prompts (distinct English and L answers, one of them "
            f"reaching rank <= 10) whose English answer does so at an earlier entry of the "
            f"{label}; clustered by fact; threshold 0.5",
            "decoders",
            "fig-decoders",
            threshold=0.5,
        )
        for dec, label in (
            ("logit", "logit lens"),
            ("tuned", "tuned lens"),
            ("patchscope", "patchscope"),
        )
    ),
    Claim(
        "consistency",
        LU,
        "The interventions raise factual consistency across languages.",
        "more consistent answers across languages",
        "gain of consistency with English under 'both' (RankC per fact and language under "
        "--metric rank; CLC, the Jaccard of the right answers, otherwise) on test; clustered "
        "by fact",
        "repair",
        "fig-repair",
    ),
    Claim(
        "task_repairs_recall",
        LU,
        "The task vector repairs recall failures: its gain is concentrated on them.",
        "the recall-engagement vector fixes recall",
        "gain of 'task' on test items the tracer classed as recall failures (unsteered model) "
        "minus its gain on translation failures; cluster bootstrap by fact",
        "repair",
        "fig-repair",
    ),
    Claim(
        "diff_repairs_translation",
        LU,
        "The back-translation vector repairs translation failures: its gain is concentrated "
        "on them.",
        "the translation vector fixes the last step",
        "gain of 'diff' on test items classed as translation failures minus its gain on "
        "recall failures; cluster bootstrap by fact",
        "repair",
        "fig-repair",
    ),
    Claim(
        "both_beat_single",
        LU,
        "The two vectors together beat the better one alone.",
        "both > either alone",
        "test gain of 'both' over the single vector that dev found better, non-English items; "
        "paired, clustered by fact",
        "repair",
        "fig-repair",
    ),
    Claim(
        "conversion_causal",
        LU,
        "The late conversion step is causal: patching the late MLP/attention outputs the "
        "tracer names restores the answer.",
        "late layers convert the English answer into the target language",
        "restored log-probability of the L answer (patched - corrupted, nats) from patching "
        "clean mlp_out/attn_out at the last token in the tracer's conversion band, against "
        "as many random sites outside it; clustered by fact",
        "conversion",
        "fig-conversion",
    ),
    *(
        Claim(
            f"external_{cond}",
            LU,
            f"The '{cond}' intervention chosen on the bundled data transfers to another dataset.",
            "independent of language and dataset",
            f"gain of '{cond}' over no intervention on the --facts benchmark's facts, scored by "
            "its own metric, with the vectors and layer/scale chosen on the bundled data only; "
            "clustered by fact; control: the norm-matched random vectors (pooled)",
            "external",
            "fig-external",
        )
        for cond in ("task", "diff", "both")
    ),
    Claim(
        "clamp_closer_centred",
        SUNDAR,
        "The clamp brings translations closer than unrelated sentences (centred distances).",
        "cosine distance between languages 0.72 -> 0.19 (Aya-23-8B)",
        "change of the per-sentence same-sentence / different-sentence distance ratio after "
        "centring, post - pre; clustered by document; control: the random clamp",
        "align",
        "fig-align",
        direction=-1,
    ),
    Claim(
        "retrieval_gain_max",
        SUNDAR,
        "The clamp raises top-1 retrieval up to 2x for some language pair.",
        "up to 2x top-1",
        "largest per-pair ratio of top-1 post / pre (pairs with a pre hit); cluster bootstrap "
        "by document; threshold 1; control: the same statistic of the random clamp",
        "align",
        "fig-align",
        threshold=1.0,
    ),
    Claim(
        "retrieval_gain_median",
        SUNDAR,
        "The median relative retrieval gain over language pairs is positive.",
        "median top-1 gain +32% (Aya), +14% (BLOOM)",
        "median over pairs of top-1 post / pre - 1; cluster bootstrap by document; control: "
        "the random clamp",
        "align",
        "fig-align",
    ),
    Claim(
        "distance_predicts_retrieval",
        SUNDAR,
        "The pairs whose distance falls most gain most in retrieval.",
        "distance and retrieval change together",
        "Spearman correlation over ordered language pairs of the change in distance with the "
        "change in top-1 (clamp - none); cluster bootstrap by document; direction: negative",
        "align",
        "fig-align",
        direction=-1,
    ),
)


def claim_by_id(cid: str) -> Claim:
    """The :class:`Claim` with id ``cid``."""
    for c in CLAIMS:
        if c.id == cid:
            return c
    raise KeyError(cid)


# --------------------------------------------------------------------------------------
# The rules: a row from its tests, Holm over the card, the verdict
# --------------------------------------------------------------------------------------


def _rule_p(claim: Claim, effect: Test, vs_control: Test | None) -> tuple[float | None, str]:
    """The row's p and how it was made (see :data:`RULES`, "p-values")."""
    if effect.p is None:
        return None, "no p-value"
    if claim.kind == "null":
        est, edge = effect.estimate.estimate, claim.null_value
        short = est is not None and (est - edge) * claim.direction < 0
        return (effect.p if short else 1.0), f"equivalence at {edge:+g}"
    if vs_control is None:
        return effect.p, f"effect vs {claim.threshold:g}"
    if vs_control.p is None:
        return None, "no p-value for the effect vs its control"
    return max(effect.p, vs_control.p), "max(effect, effect vs control)"


def _beyond(iv: Interval, t: float, d: int) -> bool:
    return iv.above(t) if d > 0 else iv.below(t)


def _short(iv: Interval, t: float, d: int) -> bool:
    return iv.below(t) if d > 0 else iv.above(t)


def verdict(
    claim: Claim,
    effect: Test | None,
    vs_control: Test | None = None,
    p: float | None = None,
    *,
    untestable: str | None = None,
) -> tuple[str, str]:
    """The verdict of ``claim`` and its reason, by the frozen :data:`RULES`, with the row's
    (Holm-adjusted, on a finished card) p-value ``p``."""
    if untestable:
        return NOT_TESTABLE, untestable
    if effect is None or not effect.estimate.defined:
        n = 0 if effect is None else effect.estimate.n
        return NOT_TESTABLE, f"no 95% interval: {n} items, fewer than two independent units"
    iv, d, t = effect.estimate, claim.direction, claim.threshold
    side, other = ("above", "below") if d > 0 else ("below", "above")
    ptxt = "no p" if p is None else f"adjusted p = {p:.3g}"
    mde = "" if effect.mde is None else f"; minimum detectable effect {effect.mde:.3f}"
    if claim.kind == "null":
        edge = claim.null_value
        if _beyond(iv, t, d):
            return NOT_HOLDS, f"the 95% interval lies {side} {t:g}: there is an effect"
        if _short(iv, edge, d) and p is not None and p < ALPHA:
            return HOLDS, f"the 95% interval lies {other} the margin {edge:+g} ({ptxt})"
        return INCONCLUSIVE, (f"the 95% interval reaches the margin {edge:+g} without "
                              f"lying {side} {t:g} ({ptxt}){mde}")  # fmt: skip
    if _short(iv, t, d):
        return NOT_HOLDS, f"the 95% interval lies {other} {t:g}"
    if vs_control is not None and _short(vs_control.estimate, 0.0, d):
        return NOT_HOLDS, f"the effect lies {other} its control (effect - control interval)"
    beyond = _beyond(iv, t, d)
    ctl_ok = vs_control is None or _beyond(vs_control.estimate, 0.0, d)
    if beyond and ctl_ok and p is not None and p < ALPHA:
        tail = "" if vs_control is None else " and beyond its control"
        return HOLDS, f"the 95% interval lies {side} {t:g}{tail} ({ptxt})"
    why = []
    if not beyond:
        why.append(f"the 95% interval straddles {t:g}")
    if not ctl_ok:
        why.append("the effect - control interval straddles 0")
    if p is None or p >= ALPHA:
        why.append(ptxt if p is None else f"{ptxt} >= {ALPHA:g}")
    return INCONCLUSIVE, "; ".join(why) + mde


def _as_test(x: Test | Interval | None) -> Test | None:
    """A bare :class:`Interval` (no p) as a :class:`Test`; a :class:`Test` as it is."""
    if x is None or isinstance(x, Test):
        return x
    return Test(x, None, None, x.n, "interval only (no test)")


def _text(t: Test | None) -> str:
    if t is None:
        return ""
    s = t.estimate.format(3)
    return s if t.p is None else f"{s}, p = {t.p:.3g}"


def make_row(
    claim: Claim,
    effect: Test | Interval | None,
    control: Test | Interval | None = None,
    *,
    vs_control: Test | None = None,
    untestable: str | None = None,
    details: str = "",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A card row: the claim, the paper's number, mechlingo's tests and a provisional verdict.

    Args:
        claim: the claim (its rule's parameters).
        effect: the effect's :class:`Test`, whose ``p`` tests H0 "effect == ``claim.null_value``"
            (the threshold; for a null claim the margin's edge).
        control: the control's own test (shown; not judged).
        vs_control: effect minus control, its own paired test (judged: the effect must lie
            beyond its control).
        untestable: why the measurement cannot be made (then ``not testable here``).
        extra: more fields of the row (``lang``, ``reading``, ``variant`` ...).

    The verdict uses the raw p; :func:`finalize` replaces it by the Holm-adjusted one.
    """
    eff, ctl = _as_test(effect), _as_test(control)
    p, how = (None, "") if eff is None or untestable else _rule_p(claim, eff, vs_control)
    v, reason = verdict(claim, eff, vs_control, p, untestable=untestable)
    return {
        "id": claim.id, "paper": claim.paper, "claim": claim.text,
        "paper_number": claim.paper_number, "measure": claim.measure,
        "rule": {"kind": claim.kind, "direction": claim.direction, "threshold": claim.threshold,
                 "margin": claim.margin, "untestable": untestable},
        "value": None if eff is None else eff.to_json(), "value_text": _text(eff) or "n/a",
        "control": None if ctl is None else ctl.to_json(), "control_text": _text(ctl),
        "vs_control": None if vs_control is None else vs_control.to_json(),
        "vs_control_text": _text(vs_control),
        "p": p, "p_rule": how, "p_adjusted": None,
        "mde": None if eff is None else eff.mde,
        "verdict": v, "reason": reason, "details": details, "figure": claim.figure,
        "stage": claim.stage, "error": None, **dict(extra or {}),
    }  # fmt: skip


def _claim_of(row: Mapping[str, Any]) -> Claim:
    r = row["rule"]
    return Claim(row["id"], row["paper"], row["claim"], row["paper_number"], row["measure"],
                 row["stage"], row["figure"], kind=r["kind"], direction=r["direction"],
                 threshold=r["threshold"], margin=r["margin"])  # fmt: skip


def finalize(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The card's rows with Holm's correction over every row that has a p (``p`` raw,
    ``p_adjusted``), and each row's verdict by the rules with its adjusted p. Error and
    untestable rows keep theirs. Call it once, on all the rows of a card."""
    out = [dict(r) for r in rows]
    adjusted = holm([r.get("p") if r.get("verdict") != ERROR else None for r in out])
    for r, pa in zip(out, adjusted, strict=True):
        r["p_adjusted"] = pa
        if r.get("verdict") == ERROR or "rule" not in r:
            continue
        head = f"({r['variant']}) " if r.get("variant") else ""
        tail = "" if pa is None else f", adjusted p = {pa:.3g}"
        r["value_text"] = head + (_text(_as_test(None if r.get("value") is None else
                                               Test.from_json(r["value"]))) or "n/a") + tail  # fmt: skip
        eff = None if r.get("value") is None else Test.from_json(r["value"])
        vs = None if r.get("vs_control") is None else Test.from_json(r["vs_control"])
        r["verdict"], r["reason"] = verdict(_claim_of(r), eff, vs, pa,
                                            untestable=r["rule"].get("untestable"))  # fmt: skip
    return out


def error_row(claim: Claim, error: str) -> dict[str, Any]:
    """The row of a claim whose stage failed: it carries the error."""
    row = make_row(claim, None)
    row.update(verdict=ERROR, reason=f"the stage '{claim.stage}' failed", error=error)
    return row


def rules_hash(claims: Sequence[Claim] = ()) -> str:
    """sha256 (16 hex digits) of :data:`RULES` and of every claim's rule parameters."""
    params = [(c.id, c.kind, c.direction, c.threshold, c.control_threshold, c.margin)
              for c in claims]  # fmt: skip
    text = json.dumps({"rules": RULES, "alpha": ALPHA, "retained_share": RETAINED_SHARE,
                       "claims": params}, sort_keys=True)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: The hash of the frozen rules and claims, written into ``claims.json``.
RULES_HASH = rules_hash(CLAIMS)


# --------------------------------------------------------------------------------------
# The card
# --------------------------------------------------------------------------------------

_VERDICT_COLOUR = {HOLDS: "#2a7", NOT_HOLDS: "#c33", INCONCLUSIVE: "#a70", NOT_TESTABLE: "#888",
                   ERROR: "#d80"}  # fmt: skip


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
        """``{row key: verdict}``; the key is the claim id, ``id/variant`` for a claim judged
        in several readings (the lowest language: literal and headroom, relative and points)."""
        return {_key(r): r["verdict"] for r in self.rows}

    def to_json(self) -> dict[str, Any]:
        """``claims.json``: the rules, the rows and the run's metadata."""
        return {"meta": self.meta, "rules": RULES, "rules_hash": RULES_HASH, "claims": self.rows}

    def to_dataframe(self) -> pd.DataFrame:
        """One row per claim: paper, claim, paper's number, mechlingo's estimate, lo, hi, n,
        control, verdict, reason."""
        import pandas as pd

        recs = []
        for r in self.rows:
            v = (r.get("value") or {}).get("estimate") or {}
            recs.append(
                {
                    "id": r["id"],
                    "variant": r.get("variant", ""),
                    "paper": r["paper"],
                    "claim": r["claim"],
                    "paper_number": r["paper_number"],
                    "estimate": v.get("estimate"),
                    "lo": v.get("lo"),
                    "hi": v.get("hi"),
                    "n": v.get("n"),
                    "p": r.get("p"),
                    "p_adjusted": r.get("p_adjusted"),
                    "mde": r.get("mde"),
                    "control": r.get("control_text", ""),
                    "vs_control": r.get("vs_control_text", ""),
                    "verdict": r["verdict"],
                    "reason": r["error"] or r["reason"],
                }
            )
        return pd.DataFrame(recs)

    def to_markdown(self) -> str:
        """``claims.md``: the verdict table (every p beside its Holm-adjusted value)."""
        head = ("| paper | claim | paper's number | mechlingo (95% CI, n) | control "
                "| effect - control | p (adjusted) | verdict |\n|---|---|---|---|---|---|---|---|\n")  # fmt: skip
        lines = []
        for r in self.rows:
            why = r["error"] or r["reason"]
            cells = [r["paper"], _label(r), r["paper_number"], _est(r),
                     r.get("control_text") or "", r.get("vs_control_text") or "", _ptext(r),
                     f"**{r['verdict']}** ({why})"]  # fmt: skip
            lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
        meta = ", ".join(f"{k}: {self.meta[k]}" for k in ("model", "budget") if k in self.meta)
        return f"# Claims card\n\n{meta}; rules {RULES_HASH}\n\n" + head + "\n".join(lines) + "\n"

    def table_html(self, link: bool = True) -> str:
        """The verdict table as HTML (links to the report's figures with ``link``)."""
        th = "".join(f"<th>{h}</th>" for h in ("paper", "claim", "paper's number",
                     "mechlingo (95% CI, n)", "control", "effect - control", "p (adjusted)",
                     "verdict", "why", "figure"))  # fmt: skip
        body = []
        for r in self.rows:
            col = _VERDICT_COLOUR.get(r["verdict"], "#222")
            fig = f"<a href='#{r['figure']}'>figure</a>" if link else html.escape(r["figure"])
            why = html.escape(r["error"] or r["reason"])
            body.append(
                "<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in (
                    r["paper"], _label(r), r["paper_number"], _est(r),
                    r.get("control_text") or "", r.get("vs_control_text") or "", _ptext(r)))
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


def _est(row: Mapping[str, Any]) -> str:
    """The row's estimate with its 95% interval and n (no p: the p column has it)."""
    v = row.get("value")
    return "n/a" if not v else Interval.from_json(v["estimate"]).format(3)


def _key(row: Mapping[str, Any]) -> str:
    """A row's key: the claim id, with ``/variant`` for a claim judged in several readings."""
    return row["id"] + (f"/{row['variant']}" if row.get("variant") else "")


def _ptext(row: Mapping[str, Any]) -> str:
    """``"0.004 (0.031)"``: the row's raw p and its Holm-adjusted p."""
    p, pa = row.get("p"), row.get("p_adjusted")
    if p is None:
        return ""
    return f"{p:.3g}" + ("" if pa is None else f" ({pa:.3g})")


def _label(row: Mapping[str, Any]) -> str:
    v = row.get("variant")
    return row["claim"] + (f" [{v}]" if v else "")


def _md(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")

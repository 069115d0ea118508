"""The papers' claims that the card checks, each with its rule's parameters and its family.

Every claim of Lu et al. (EMNLP 2025) and Sundar et al. (ACL 2025) that mechlingo checks is a
:class:`Claim`. Each paper has one pre-registered primary family (:data:`PRIMARY`: its
headline claims, one reading each); every other row is secondary (exploratory). The rules
that turn a claim's tests into a verdict are in :mod:`mechlingo.card.rules`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "CLAIMS",
    "LU",
    "PRIMARY",
    "SUNDAR",
    "Claim",
    "PlanFacts",
    "claim_by_id",
    "row_family",
    "LATENT_ENGLISH",
    "RECALL_FAILURES",
    "TASK_VECTOR",
    "DIFF_VECTOR",
    "LOWEST_LANGUAGE",
    "INDEPENDENT_RELATIONS",
    "INDEPENDENT_LANGUAGES",
    "RANDOM_VECTOR",
    "EXPERTS_EXIST",
    "EXPERTS_DISJOINT",
    "CLAMP_STEERS",
    "CLAMP_CLOSER",
    "RETRIEVAL_IMPROVES",
    "RANDOM_NEURONS",
    "ENGLISH_GAP",
    "LATENT_ENGLISH_TUNED",
    "LATENT_ENGLISH_PATCHSCOPE",
    "CONSISTENCY",
    "TASK_REPAIRS_RECALL",
    "BOTH_BEAT_SINGLE",
    "CONVERSION_CAUSAL",
    "EXTERNAL_TASK",
    "EXTERNAL_DIFF",
    "EXTERNAL_BOTH",
    "CLAMP_CLOSER_CENTRED",
    "RETRIEVAL_GAIN_MAX",
    "RETRIEVAL_GAIN_MEDIAN",
    "DISTANCE_PREDICTS_RETRIEVAL",
    "SAME_MECHANISM",
]


#: How the planner simulates a primary row: the design of its test, which sets the units
#: (clusters) the budget's data gives it and the draws it reads.
Design = Literal[
    "english_first",  # a share over the test facts' queries (fact clusters)
    "failure_share",  # a share over the facts with recall or translation failures
    "relative_gain",  # the lowest language's relative gain against random draws
    "cell_population",  # the transfer cells' held-out gain against their own random draws
    "condition_population",  # a vector's gain over the test facts against random draws
    "draw_rank",  # the rank of the effect among the random draws
    "language_overlap",  # the overlap of the languages' expert sets
    "bos_population",  # the clamp's rate over the BOS samples against random clamps
    "document_population",  # a gain over the evaluation documents against random clamps
]


@dataclass(frozen=True)
class PlanFacts:
    """What the power planner (:mod:`mechlingo.card.plan`) needs of a primary claim: the true
    ``effect`` it is planned for (beyond its threshold in its direction, in the judged
    outcome's units) and where that number comes from (``source``), its test's ``design``,
    and stated ``bounds`` where no split measures the outcome before the run (``sd`` of one
    unit, ``icc``, ``base``)."""

    effect: float
    source: str
    design: Design
    bounds: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    """One claim: what the paper says, what mechlingo measures, and the rule's parameters.

    ``direction`` +1: the effect must be above ``threshold`` (-1: below). ``margin``: for a
    null claim, how far either side of ``threshold`` an effect may lie and still count as none
    (an equivalence test). ``figure`` is the anchor of the report section that shows it.
    ``family``: ``primary`` (the paper's pre-registered headline claims, Holm inside the
    paper's family) or ``secondary`` (exploratory, Benjamini-Hochberg). ``primary_variant``:
    for a primary claim judged in several readings, the one reading in the primary family
    (the others are secondary). ``sesoi``: the smallest effect of interest beyond the
    threshold; an interval that lies short of ``threshold + direction * sesoi`` (and not
    beyond the threshold) refutes the claim (a precise zero is a refutation, not an
    inconclusive row). ``post_hoc``: where the primary reading was chosen after the data was
    seen, what was changed and when (the card prints it on the row).
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
    family: Literal["primary", "secondary"] = "secondary"
    primary_variant: str | None = None
    sesoi: float | None = None
    post_hoc: str | None = None
    #: The planner's facts of a primary claim (not part of the rules: the hash leaves it out).
    plan: PlanFacts | None = None

    @property
    def null_value(self) -> float:
        """The value of H0 that the effect's p tests: the threshold (for a null claim the
        centre of the equivalence margin; the rules test both of its edges)."""
        return self.threshold


def row_family(claim: Claim, variant: str | None = None) -> Literal["primary", "secondary"]:
    """The family of a row of ``claim`` in reading ``variant``: the claim's, except that a
    primary claim's readings other than its ``primary_variant`` are secondary."""
    if claim.family == "primary" and claim.primary_variant and variant != claim.primary_variant:
        return "secondary"
    return claim.family


LU = "lu2025"
#: The share of L's clean-vs-corrupted difference that the English circuit must carry on L's
#: prompts for "the same mechanism" (fixed before any circuit card was run: more than half).
SAME_MECHANISM_SHARE = 0.5
SUNDAR = "sundar2025"
#: The primary reading of the lowest-language claim (">35%"): the relative gain in the
#: lowest language(s) of the headroom rule. The paper's lowest language is one the
#: interventions can move; the literal rule's lowest language may sit at a floor where no
#: vector can act, and ">35%" is a relative number.
PRIMARY_LOWEST = "headroom rule, relative"
#: The primary reading of the independence claims: the pooled held-out gain.
PRIMARY_HELD_OUT = "held-out gain"
#: The smallest effect of interest of a gain in the gold share (or accuracy) and of a change
#: in mean top-1 retrieval; the equivalence margins of the null claims are half of it.
SESOI_GAIN = 0.05
#: The equivalence margin of the null claims: half the smallest effect of interest, so that
#: an effect of interest can never lie inside it ("no gain" cannot hold at +0.045).
MARGIN = SESOI_GAIN / 2
#: Rows judged against a random population whose decision p moved after a card was seen.
POST_HOC_POPULATION = (
    "the population p moved from the rank p to a t test after the rank p made rows "
    "undecidable (log 2026-12-03); since the rules of 2026-12-06 it is the rank p again"
)

CLAIMS: tuple[Claim, ...] = (
    Claim(
        "latent_english",
        LU,
        "The English answer is decodable in the middle layers before the target-language "
        "answer (latent-language curves).",
        "qualitative: English is the latent language of recall (Fig. 2-3)",
        "share of non-English queries (English answer != L answer, one of them reaches rank "
        "<= 10 before the output) whose English answer reaches it at an earlier layer; "
        "clustered by fact; threshold 0.5; control: the mismatched fact's English answer, "
        "judged on the same item set (queries where the English, the mismatched English or "
        "the L answer reaches rank <= 10)",
        "trace",
        "fig-latent",
        threshold=0.5,
        family="primary",
        plan=PlanFacts(
            0.15, "English first in 65% of the queries (threshold 50%)", "english_first"
        ),
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
        family="primary",
        plan=PlanFacts(0.15, "65% of the errors recall failures (threshold 50%)", "failure_share"),
    ),
    Claim(
        "task_vector",
        LU,
        "The recall-engagement vector raises accuracy.",
        "raises recall accuracy (task vector, mid layers)",
        "test gain of 'task' over 'orig' in the gold answer's probability share among the "
        "candidates (0/1 correctness where the metric gives no candidate scores), non-English "
        "items, clustered by fact; control: the norm-matched random vectors, judged by the "
        "effect's rank among them",
        "repair",
        "fig-repair",
        family="primary",
        plan=PlanFacts(
            SESOI_GAIN,
            "smallest effect of interest: +0.05 in the judged outcome",
            "condition_population",
        ),
        sesoi=SESOI_GAIN,
        post_hoc=POST_HOC_POPULATION,
    ),
    Claim(
        "diff_vector",
        LU,
        "The back-translation vector raises accuracy.",
        "raises recall accuracy (translation difference vector, late layers)",
        "test gain of 'diff' over 'orig' in the gold answer's probability share among the "
        "candidates (0/1 correctness where the metric gives no candidate scores), non-English "
        "items, clustered by fact; control: the norm-matched random vectors, judged by the "
        "effect's rank among them",
        "repair",
        "fig-repair",
        family="primary",
        plan=PlanFacts(
            SESOI_GAIN,
            "smallest effect of interest: +0.05 in the judged outcome",
            "condition_population",
        ),
        sesoi=SESOI_GAIN,
        post_hoc=POST_HOC_POPULATION,
    ),
    Claim(
        "lowest_language",
        LU,
        "Both together raise the lowest-performing language by more than 35%.",
        "> +35%, lowest-performing language",
        "test gain of 'both' over 'orig' (gold share; 0/1 without candidate scores) in the "
        "lowest language(s) of the literal rule (lowest "
        "dev zero-shot accuracy, non-English) and of the headroom rule (the same among those "
        "whose dev few-shot beats zero-shot, McNemar p < 0.1), tied languages pooled; each "
        "relative (clustered log ratio, when the baseline is above 0) and in points; "
        "threshold 0.35; control: random vectors, judged against it",
        "repair",
        "fig-headroom",
        threshold=0.35,
        family="primary",
        plan=PlanFacts(
            0.35,
            "a true relative gain of +70% (twice the paper's threshold) against the threshold +35%",
            "relative_gain",
        ),
        primary_variant=PRIMARY_LOWEST,
        post_hoc="the relative reading of '>35%' became primary after the points reading "
        "failed (log 2026-12-03); " + POST_HOC_POPULATION,
    ),
    Claim(
        "independent_relations",
        LU,
        "The vectors are independent of relations (the transfer matrix, by relation).",
        "independent of language and dataset",
        "gain of vectors built without relation R, tested on R (rows all_but_<R>), in the gold "
        "answer's probability share among the candidates (0/1 correctness where the metric "
        "gives no candidate scores), pooled over the held-out cells and clustered by fact, "
        "against a population of norm-matched random vectors per cell (the effect's rank "
        "among them); and the share of the in-pool (all) gain on R that they keep (> 0.5)",
        "transfer_relation",
        "fig-transfer",
        family="primary",
        plan=PlanFacts(
            SESOI_GAIN, "smallest effect of interest: +0.05 held out", "cell_population"
        ),
        primary_variant=PRIMARY_HELD_OUT,
        sesoi=SESOI_GAIN,
    ),
    Claim(
        "independent_languages",
        LU,
        "The vectors are independent of languages (the transfer matrix, by language).",
        "independent of language and dataset",
        "gain of vectors built without language L, tested on L (rows all_but_<L>), in the gold "
        "share (0/1 correctness without candidate scores), pooled and clustered by fact, "
        "against a population of norm-matched random vectors per cell (the effect's rank "
        "among them); and the retained share (> 0.5)",
        "transfer_lang",
        "fig-transfer",
        family="primary",
        plan=PlanFacts(
            SESOI_GAIN, "smallest effect of interest: +0.05 held out", "cell_population"
        ),
        primary_variant=PRIMARY_HELD_OUT,
        sesoi=SESOI_GAIN,
    ),
    Claim(
        "random_vector",
        LU,
        "A norm-matched random vector does not raise accuracy.",
        "no gain (control)",
        "test gain of the random vectors (seeds pooled per item, paired with orig) on the "
        "non-English items (gold share; 0/1 without candidate scores), clustered by fact; "
        "holds when it lies within +/- 0.025 (the margin: half the smallest effect of "
        "interest, 0.05)",
        "repair",
        "fig-repair",
        kind="null",
        margin=MARGIN,
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
        family="primary",
        plan=PlanFacts(
            0.10,
            "AUROC 0.10 above the random neuron sets' (their SD 0.03)",
            "draw_rank",
            {"sd": 0.03},
        ),
        post_hoc=POST_HOC_POPULATION,
    ),
    Claim(
        "experts_disjoint",
        SUNDAR,
        "The expert sets of different languages barely overlap.",
        "barely overlap",
        "mean share of shared neurons between the top-k sets (the clamp's k) of two languages "
        "(all pairs) minus the chance share k/N (N MLP neurons, the hypergeometric "
        "expectation); delete-one-language jackknife t interval (languages are the units); "
        "holds when the excess over chance is below 0.10; control: the chance overlap with "
        "its exact hypergeometric p",
        "experts",
        "fig-overlap",
        direction=-1,
        threshold=0.10,
        family="primary",
        plan=PlanFacts(
            0.05,
            "excess overlap 0.05 below the threshold 0.10 (pairs' SD 0.05)",
            "language_overlap",
            {"sd": 0.05},
        ),
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
        "clamp of the same k, judged by the clamp's rank among them",
        "experts",
        "fig-kcurve",
        family="primary",
        plan=PlanFacts(
            0.10,
            "smallest effect of interest: +0.10 target-language rate",
            "bos_population",
            {"base": 0.5},
        ),
        sesoi=0.10,
        post_hoc=POST_HOC_POPULATION,
    ),
    Claim(
        "clamp_closer",
        SUNDAR,
        "The clamp brings languages closer (distances before and after; same-sentence / "
        "different-sentence ratio).",
        "cosine distance between languages 0.72 -> 0.19 (Aya-23-8B), 0.72 -> 0.17 (BLOOM-7B)",
        "change of the mean cosine distance between languages (same sentence), post - pre, "
        "paired per sentence (sign-flip p, bootstrap CI); direction: down; control: the "
        "random clamp, judged by the clamp's rank among them",
        "align",
        "fig-align",
        direction=-1,
        family="primary",
        plan=PlanFacts(
            0.5,
            "standardised: paired d = 0.5 (no dev variance before the clamp)",
            "document_population",
            {"sd": 1.0, "icc": 0.3, "base": 0.0},
        ),
        post_hoc=POST_HOC_POPULATION,
    ),
    Claim(
        "retrieval_improves",
        SUNDAR,
        "Retrieval improves: before, after, and the random control.",
        "median top-1 gain +32% (Aya), +14% (BLOOM)",
        "change of mean top-1 retrieval over all ordered language pairs, post - pre, paired "
        "per sentence; control: the random clamp, judged by the clamp's rank among them",
        "align",
        "fig-align",
        family="primary",
        plan=PlanFacts(
            0.10,
            "+0.10 mean top-1 (twice the smallest effect of interest)",
            "document_population",
            {"sd": 0.25, "icc": 0.3, "base": 0.5},
        ),
        sesoi=SESOI_GAIN,
        post_hoc=POST_HOC_POPULATION,
    ),
    Claim(
        "random_neurons",
        SUNDAR,
        "The same values written into random neurons do not help.",
        "no gain (control)",
        "change of mean top-1 retrieval, random clamp - pre, paired per sentence; holds when "
        "it lies within +/- 0.025 (half the smallest effect of interest, 0.05); secondary: "
        "it is retrieval_improves' control",
        "align",
        "fig-align",
        kind="null",
        margin=MARGIN,
    ),
    # ---- the secondary claims: further readings and the papers' other numbers
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
        # the logit lens is latent_english's own measurement (the trace records): no row
        for dec, label in (
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
        "Each vector repairs its own failure class: the recall-engagement vector recall "
        "failures, the back-translation vector translation failures.",
        "the recall-engagement vector fixes recall; the translation vector the last step",
        "difference in differences of 0/1 correctness (P@1 under --metric rank): the gain of "
        "'task' minus that of 'diff' on test items the "
        "tracer classed as recall failures (unsteered model), minus the same on translation "
        "failures (one contrast reads both halves of the claim: one row); CR2 by fact",
        "repair",
        "fig-repair",
    ),
    Claim(
        "both_beat_single",
        LU,
        "The two vectors together beat the better one alone.",
        "both > either alone",
        "test gain in 0/1 correctness (P@1 under --metric rank; the gold log-share gain in the "
        "details) of 'both' over the single vector that dev found better, non-English items; "
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
            f"The '{cond}' intervention chosen on the card's facts transfers to another dataset.",
            "independent of language and dataset",
            f"gain of '{cond}' over no intervention on the --external benchmark's facts, in the "
            "gold answer's probability share among the candidates under its own metric (0/1 "
            "correctness where that metric gives no candidate scores: KLAR), with the vectors "
            "and layer/scale chosen on the card's facts only (the bundled stems or --facts); clustered by fact; control: "
            f"norm-matched random vectors at the layer and scale of '{cond}', judged by the "
            "effect's rank among them",
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
        "by document; threshold 2 (the paper's 'up to 2x'); judged against the random "
        "clamps' own maxima (its rank among them: exact permutation p, floor 1/(m + 1))",
        "align",
        "fig-align",
        threshold=2.0,
        family="primary",
        plan=PlanFacts(
            2.0, "the clamp's largest ratio 2 SD above the random clamps'", "draw_rank", {"sd": 1.0}
        ),
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
    Claim(
        "same_mechanism",
        LU,
        "The model recalls a fact in language L with the same mechanism it uses for English.",
        "English-centric recall pipeline (the paper's reading of its traces; no circuit number)",
        "faithfulness of the English circuit (EAP-IG edges chosen on English dev facts at "
        "faithfulness 0.8) on L's test subject pairs, ratio of sums with a CR2 delta-method "
        "interval clustered by fact, above 0.5; control: the edge Jaccard of the English and "
        "L dev circuits against size-matched random circuits from the same scored graph "
        "(its rank among the draws)",
        "circuits",
        "fig-circuits",
        threshold=SAME_MECHANISM_SHARE,
    ),
)


#: Each claim by name: the row builders refer to these objects (not to id strings).
_BY_ID = {c.id: c for c in CLAIMS}
LATENT_ENGLISH = _BY_ID["latent_english"]
RECALL_FAILURES = _BY_ID["recall_failures"]
TASK_VECTOR = _BY_ID["task_vector"]
DIFF_VECTOR = _BY_ID["diff_vector"]
LOWEST_LANGUAGE = _BY_ID["lowest_language"]
INDEPENDENT_RELATIONS = _BY_ID["independent_relations"]
INDEPENDENT_LANGUAGES = _BY_ID["independent_languages"]
RANDOM_VECTOR = _BY_ID["random_vector"]
EXPERTS_EXIST = _BY_ID["experts_exist"]
EXPERTS_DISJOINT = _BY_ID["experts_disjoint"]
CLAMP_STEERS = _BY_ID["clamp_steers"]
CLAMP_CLOSER = _BY_ID["clamp_closer"]
RETRIEVAL_IMPROVES = _BY_ID["retrieval_improves"]
RANDOM_NEURONS = _BY_ID["random_neurons"]
ENGLISH_GAP = _BY_ID["english_gap"]
LATENT_ENGLISH_TUNED = _BY_ID["latent_english_tuned"]
LATENT_ENGLISH_PATCHSCOPE = _BY_ID["latent_english_patchscope"]
CONSISTENCY = _BY_ID["consistency"]
TASK_REPAIRS_RECALL = _BY_ID["task_repairs_recall"]
BOTH_BEAT_SINGLE = _BY_ID["both_beat_single"]
CONVERSION_CAUSAL = _BY_ID["conversion_causal"]
EXTERNAL_TASK = _BY_ID["external_task"]
EXTERNAL_DIFF = _BY_ID["external_diff"]
EXTERNAL_BOTH = _BY_ID["external_both"]
CLAMP_CLOSER_CENTRED = _BY_ID["clamp_closer_centred"]
RETRIEVAL_GAIN_MAX = _BY_ID["retrieval_gain_max"]
RETRIEVAL_GAIN_MEDIAN = _BY_ID["retrieval_gain_median"]
DISTANCE_PREDICTS_RETRIEVAL = _BY_ID["distance_predicts_retrieval"]
SAME_MECHANISM = _BY_ID["same_mechanism"]


def claim_by_id(cid: str) -> Claim:
    """The :class:`Claim` with id ``cid``."""
    for c in CLAIMS:
        if c.id == cid:
            return c
    raise KeyError(cid)


#: Each paper's pre-registered primary family: its headline claims (ids), Holm inside each.
PRIMARY: dict[str, tuple[str, ...]] = {
    paper: tuple(c.id for c in CLAIMS if c.paper == paper and c.family == "primary")
    for paper in (LU, SUNDAR)
}

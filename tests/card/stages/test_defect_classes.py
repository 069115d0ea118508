"""One hand case per defect class of the claims card (the rules of 2026-12-06), each through
the card's own row builders and verdict code: the judged outcome is the stated one, the
latent-English control on the same items, one definition of beating a control, margins at
most half the smallest effect of interest, refutable nulls, "up to 2x" at 2, the families,
the p shown, and the pre-registration on the card."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from mechlingo.card import claims
from mechlingo.card.clustered_tests import Test
from mechlingo.card.rules import (
    HOLDS,
    INCONCLUSIVE,
    NOT_HOLDS,
    RULES_HASH,
    ClaimsCard,
    finalize,
    make_row,
)
from mechlingo.card.stages import align, experts, repair, trace
from mechlingo.kernels.significance import Interval

LANGS = ("es", "fr", "ru")


def _data(n, orig, conds, share=None):
    """A repair result of ``n`` facts in es, fr and ru: ``orig`` and ``conds`` give each
    condition's 0/1 outcome per item (the same in every language), ``share`` its gold share."""
    ids = [f"capital/{i}" for i in range(n)]
    outs = {"orig": orig, **conds}
    out = {c: {lg: [bool(x) for x in v] for lg in ("en", *LANGS)} for c, v in outs.items()}
    lowest = {"languages": ["es", "fr"], "literal_languages": ["ru"], "p_threshold": 0.1,
              "rule": "headroom rule", "literal_rule": "literal rule"}  # fmt: skip
    d = {"summary": {"selected": "both", "dev_effect": "chosen", "config": {}}, "outcomes": out,
         "ids": dict.fromkeys(out["orig"], ids), "lowest": lowest,
         "n_ids": {"build": 1, "dev": 1, "test": n}}  # fmt: skip
    if share is not None:
        d["share"] = {c: {lg: list(v) for lg in ("en", *LANGS)} for c, v in share.items()}
    return d


def _rows(d):
    return {(r["id"], r.get("variant")): r for r in finalize(repair.rows_repair(d))}


def test_the_judged_outcome_is_the_gold_share():
    """The share rises 0.30 -> 0.55 on every item while the top-1 answer (already right)
    does not move: the rows read +0.25, not 0.000, and say what they judge."""
    n = 12
    right = [1] * n
    conds = {"task": right, "diff": right, "both": right, "random_s0": right, "random_s1": right}
    lo = [0.30 + 0.01 * (i % 3 - 1) for i in range(n)]  # 0.29, 0.30, 0.31: mean 0.30
    hi = [0.55 + 0.01 * (i % 2) - 0.005 for i in range(n)]  # 0.545, 0.555: mean 0.55
    share = {"orig": lo, "task": hi, "diff": hi, "both": hi, "random_s0": lo,
             "random_s1": [x + 0.01 for x in lo]}  # fmt: skip
    rows = _rows(_data(n, right, conds, share))
    task = rows[("task_vector", None)]
    assert task["value"]["estimate"]["estimate"] == pytest.approx(0.25)
    assert task["outcome"] == "gold share" and "outcome: gold share" in task["details"]
    assert rows[("diff_vector", None)]["value"]["estimate"]["estimate"] == pytest.approx(0.25)
    head = rows[("lowest_language", "headroom rule, relative")]
    assert head["value"]["estimate"]["estimate"] == pytest.approx(0.55 / 0.30 - 1)
    rnd = rows[("random_vector", None)]
    assert rnd["value"]["estimate"]["estimate"] == pytest.approx(0.005)
    assert task["verdict"] != NOT_HOLDS and head["verdict"] != NOT_HOLDS


def test_latent_english_and_its_control_on_the_same_items():
    """A symmetric null: on 10 facts the English answer is decodable and the mismatched
    fact's is not, on 10 others the reverse (the L answer never). A filter on the real
    English answer alone reads 1.000 against 0.000; on the same items the two are equal."""

    def rec(i, e, m):
        return {"id": f"x/{i}", "lang": "fr", "answer": "Roma", "answer_en": "Rome",
                "correct": True, "class": "correct", "first_en_layer": e,
                "first_answer_layer": -1, "first_mismatch_en_layer": m}  # fmt: skip

    records = [rec(i, 5, -1) for i in range(10)] + [rec(i, -1, 5) for i in range(10, 20)]
    row, _ = finalize(trace.rows_trace({"records": records}))
    assert row["value"]["estimate"]["estimate"] == pytest.approx(1.0)  # English first: 10 of 10
    assert row["vs_control"]["estimate"]["estimate"] == pytest.approx(0.0)
    assert row["control"]["estimate"]["estimate"] == pytest.approx(0.5)
    assert row["verdict"] != HOLDS


def test_a_vector_beaten_by_4_of_20_draws_does_not_hold():
    """20 random draws, 4 of them as good as the task vector everywhere: the effect's rank
    p is (1 + 4) / 21 = 0.238, so "beats its control" cannot be said, whatever the t test of
    effect - population mean gives."""
    n = 20
    orig = [1] * 4 + [0] * 16
    task = [1] * 16 + [0] * 4
    conds = {"task": task, "diff": orig, "both": task}
    conds |= {f"random_s{i}": orig for i in range(16)}
    conds |= {f"random_s{i}": [1] * n for i in range(16, 20)}
    rows = _rows(_data(n, orig, conds))
    t = rows[("task_vector", None)]
    assert t["vs_control"]["p"] == pytest.approx(5 / 21)
    assert t["verdict"] == INCONCLUSIVE


def test_the_equivalence_margin_is_half_the_smallest_effect_of_interest():
    """A random vector's gain of +0.045 [0.041, 0.049] is an effect of interest's size:
    "does not raise accuracy" does not hold (margin 0.025, not 0.05)."""
    t = Test(Interval(0.045, 0.041, 0.049, 40), 1e-9, 0.01, 40, "hand",
             {"se": 0.002, "df": 39, "interval": "t"})  # fmt: skip
    (row,) = finalize([make_row(claims.RANDOM_VECTOR, t)])
    assert row["verdict"] == NOT_HOLDS
    for c in (claims.RANDOM_VECTOR, claims.RANDOM_NEURONS):
        assert c.margin is not None and c.margin <= claims.SESOI_GAIN / 2


def test_a_relative_gain_where_nothing_changes_is_a_testable_zero():
    """'both' changes no item of the headroom languages (40 facts, half right): the relative
    gain is exactly 0 with the exact no-change bound, it stays in the primary family, and
    it refutes "> 35%"."""
    n = 40
    orig = [1, 0] * (n // 2)
    conds = {"task": orig, "diff": orig, "both": orig}
    conds |= {f"random_s{i}": orig for i in range(3)}
    rows = _rows(_data(n, orig, conds))
    head = rows[("lowest_language", "headroom rule, relative")]
    assert head["value"]["estimate"]["estimate"] == 0.0 and head["p"] is not None
    assert head["family"] == "primary" and head["verdict"] == NOT_HOLDS


def test_a_precise_zero_refutes_a_threshold_zero_claim():
    """The task vector moves the share by at most +/- 0.001 on 40 facts: a precise zero,
    below the smallest effect of interest (0.05): "does not hold", not "inconclusive"."""
    n = 40
    right = [1] * n
    rng = np.random.default_rng(0)
    base = list(rng.uniform(0.3, 0.6, n))
    task = [b + rng.uniform(-1e-3, 1e-3) for b in base]
    conds = {c: right for c in ("task", "diff", "both", "random_s0", "random_s1")}
    share = {"orig": base, "task": task, "diff": task, "both": task, "random_s0": base,
             "random_s1": base}  # fmt: skip
    t = _rows(_data(n, right, conds, share))[("task_vector", None)]
    assert t["verdict"] == NOT_HOLDS and "precise zero" in t["reason"]


def _gain_details(n_docs=20, per=2):
    """3 languages (6 ordered pairs), ``n_docs`` documents of ``per`` sentences: each pair
    retrieves half the sentences before the clamp and three in four after (ratio 1.5 on
    every pair); 40 random clamps that change nothing."""
    rng = np.random.default_rng(1)
    n = n_docs * per
    pairs = [f"{a}->{b}" for a in "xyz" for b in "xyz" if a != b]
    pre = np.tile((np.arange(n) % 2 == 0).astype(float), (6, 1))
    post = pre.copy()
    post[:, 1::4] = 1  # half the misses become hits: 0.5 -> 0.75
    dist = rng.random((6, n))
    d = {"pairs": pairs, "docs": [f"d{i // per}" for i in range(n)]}
    for arm, h in (("pre", pre), ("post", post), ("control", pre)):
        d[arm] = {"hits": h.tolist(), "dist": dist.tolist(),
                  "ratio_centred": (dist.mean(0) + 0.5).tolist()}  # fmt: skip
    d["controls"] = [d["control"]] * 40
    return d


def test_up_to_2x_is_judged_at_2():
    """Retrieval up 1.5x on every pair, beyond all 40 random clamps: "up to 2x" is judged at
    2, so a largest ratio surely below 2 does not hold (at threshold 1 it held)."""
    rows = finalize(align.rows_align_extra({"details": _gain_details()}))
    row = next(r for r in rows if r["id"] == "retrieval_gain_max")
    assert row["value"]["estimate"]["estimate"] == pytest.approx(1.5)
    assert row["vs_control"]["p"] == pytest.approx(1 / 41)
    assert row["rule"]["threshold"] == 2.0 and row["verdict"] == NOT_HOLDS


def test_the_headline_claims_are_primary_and_controls_are_not():
    assert claims.PRIMARY[claims.LU][-2:] == ("independent_relations", "independent_languages")
    assert "retrieval_gain_max" in claims.PRIMARY[claims.SUNDAR]
    assert "random_neurons" not in claims.PRIMARY[claims.SUNDAR]


def test_identical_readings_count_once_inside_benjamini_hochberg():
    """The literal and the headroom rule pick the same languages: their points rows read the
    same test and count once among the secondary rows."""
    n = 12
    orig = [1] * 3 + [0] * 9
    both = [1] * 9 + [0] * 3
    conds = {"task": both, "diff": orig, "both": both, "random_s0": orig, "random_s1": orig}
    d = _data(n, orig, conds)
    d["lowest"]["literal_languages"] = ["es", "fr"]
    rows = finalize(repair.rows_repair(d))
    lit = next(r for r in rows if r.get("variant") == "literal rule, points")
    hr = next(r for r in rows if r.get("variant") == "headroom rule, points")
    assert lit["value"] == hr["value"] and lit["p_adjusted"] == hr["p_adjusted"]
    sec = [r for r in rows if r["family"] == "secondary" and r["p"] is not None]
    assert f"over the {len(sec) - 1} secondary rows" in lit["adjustment"]["method"]
    assert "counted once" in "".join(r["adjustment"]["method"] for r in (lit, hr))


def test_the_p_column_shows_the_deciding_p_and_never_0():
    """A row that does not hold shows the p of the other side; an underflowed
    hypergeometric p is shown as "< 1e-k", never 0."""
    zero = Test(Interval(0.001, -0.005, 0.007, 40), 0.8, 0.01, 40, "hand",
                {"se": 0.003, "df": 39, "interval": "t"})  # fmt: skip
    (row,) = finalize([make_row(claims.TASK_VECTOR, zero)])
    card = ClaimsCard([row])
    assert row["verdict"] == NOT_HOLDS and row["p"] == 0.8  # the claim's side p
    assert row["p_deciding"] == row["p_against"] < 1e-12  # the precise zero decided
    line = card.to_markdown().splitlines()[-1]
    assert "| 0.8 (0.8) |" not in line and "| < 1e-" in line
    ov = {"k": 500, "matrix": [[1.0, 0.95, 0.95], [0.95, 1.0, 0.95], [0.95, 0.95, 1.0]],
          "chance": 0.1}  # fmt: skip
    dis = experts._row_disjoint(ov)
    assert dis["control"]["p"] > 0
    assert "p = < 1e-" in dis["control_text"] or "p < 1e-" in dis["control_text"]
    assert sps.hypergeom.sf(474, 5000, 500, 500) == 0.0  # scipy underflows here
    assert card.to_dataframe()["verdict"][0] == NOT_HOLDS


def test_an_underflowed_p_is_never_shown_as_0_and_the_report_shows_the_deciding_p():
    """A p that underflowed to 0 reads "< 1e-k" in the row's text and the report's headline,
    and the headline shows the p that decided the verdict (the other side's when the row
    does not hold), not the claim side's."""
    from mechlingo.report.replicate import replicate_report

    big = Test(Interval(0.4, 0.3, 0.5, 40), 0.0, 0.05, 40, "hand",
               {"se": 0.05, "df": 39, "interval": "t"})  # fmt: skip
    (row,) = finalize([make_row(claims.TASK_VECTOR, big)])
    assert row["p_adjusted"] == 0.0 and "adjusted p = < 1e-12" in row["value_text"]
    assert "= 0," not in row["value_text"] and not row["value_text"].endswith("= 0")
    zero = Test(Interval(0.001, -0.005, 0.007, 40), 0.8, 0.01, 40, "hand",
                {"se": 0.003, "df": 39, "interval": "t"})  # fmt: skip
    (nh,) = finalize([make_row(claims.TASK_VECTOR, zero)])
    page = replicate_report(ClaimsCard([row, nh])).render()
    assert page.count("deciding adjusted p = &lt; 1e-") + page.count(
        "deciding adjusted p = < 1e-") == 2  # fmt: skip
    assert "deciding adjusted p = 0.8" not in page  # the claim side's p is not the headline


def test_the_card_says_which_readings_were_chosen_after_the_data():
    """The pre-registration a reader can check: the rules and budgets hashed into
    claims.json and the card, and a primary reading chosen after its data was seen marked."""
    rows = finalize(repair.rows_repair(_data(12, [0] * 12, {
        c: [1] * 6 + [0] * 6 for c in ("task", "diff", "both", "random_s0", "random_s1")})))  # fmt: skip
    card = ClaimsCard(rows, meta={"budgets_hash": "abc"})
    head = next(r for r in rows if r.get("variant") == "headroom rule, relative")
    assert "after the points reading failed" in head["post_hoc"]
    assert "reading chosen after the data was seen" in card.to_markdown()
    pre = card.to_json()["preregistration"]
    assert pre["rules_hash"] == RULES_HASH and pre["budgets_hash"] == "abc"
    assert len(pre["hash"]) == 16 and pre["hash"] in card.to_markdown()


def test_each_condition_is_judged_against_its_own_population():
    """Dev selected 'both'; the random population matched to 'both' (``random_s``) does
    nothing, while the task vector's own population (random task at its layer and scale)
    does as well as the task vector on every item. The task row is judged against its own
    population: rank p 1 (5 of 5 draws as good), not 1/6 against the population of 'both'."""
    n = 12
    conds = {"task": [1] * n, "diff": [0] * n, "both": [1] * n}
    conds |= {f"random_s{i}": [0] * n for i in range(5)}  # matched to 'both'
    conds |= {f"random_task_s{i}": [1] * n for i in range(5)}  # matched to 'task'
    conds |= {f"random_diff_s{i}": [0] * n for i in range(5)}
    d = _data(n, [0] * n, conds)
    d["populations"] = {"task": "random_task_s", "diff": "random_diff_s", "both": "random_s"}
    rows = _rows(d)
    task = rows[("task_vector", None)]
    assert task["vs_control"]["extra"]["p_rank"] == pytest.approx(1.0)
    assert task["control"]["estimate"]["estimate"] == pytest.approx(1.0)  # its draws' gain
    assert "random_task_s0" in task["details"] and task["verdict"] != HOLDS
    both = rows[("lowest_language", "headroom rule, points")]
    assert both["vs_control"]["extra"]["p_rank"] == pytest.approx(1 / 6)  # against random_s


def _external_items(n, share_orig, share_new, conds):
    """Benchmark items of ``n`` facts in fr (and en): every condition right on every item;
    the gold share ``share_orig`` under orig and the random draws, ``share_new`` under
    ``conds``."""

    def recs(share):
        return [{"id": f"b/{i}", "lang": lg, "correct": True, "logshare": float(np.log(share)),
                 "share": share, "ranking": [0, 1]} for lg in ("en", "fr") for i in range(n)]  # fmt: skip

    items = {"orig": recs(share_orig)}
    items |= {c: recs(share_new) for c in conds}
    items |= {f"random_{c}_s{i}": recs(share_orig) for c in ("task", "diff", "both")
              for i in range(3)}  # fmt: skip
    return items


def test_the_external_rows_judge_the_gold_share():
    """A benchmark scored by ranking (BMLAMA): the gold share rises 0.30 -> 0.55 on every item
    while the top-1 answer (already right) does not move. The external rows state the gold
    share and read +0.25 against their own conditions' populations (they read 0.000: 0/1)."""
    from mechlingo.card.stages import external

    data = {"metric": "rank", "n_facts": 10, "config": {},
            "items": _external_items(10, 0.30, 0.55, ("task", "diff", "both")),
            "populations": {c: f"random_{c}_s" for c in ("task", "diff", "both")}}  # fmt: skip
    rows = external.rows_external(data)
    assert len(rows) == 3
    for row in rows:
        assert row["value"]["estimate"]["estimate"] == pytest.approx(0.25)
        assert row["outcome"] == "gold share" and "gold" in row["measure"]
        assert row["vs_control"]["extra"]["draws"] == 3


def _cell(row, col, n, orig, steered, draws, shares=None):
    ids = [f"{col}/{i}" for i in range(n)]
    items = {"ids": ids, "orig": orig, "steered": steered, "control": draws[0],
             "controls": draws}  # fmt: skip
    if shares is not None:
        items["share"] = shares
    return {"row": row, "col": col, "items": items}


def test_the_independence_rows_judge_a_population_of_draws():
    """Held-out cells with 20 random draws each, all below the held-out vectors: the rank p
    is 1/21 (the population's floor), not the 0.5 floor of one draw treated as fixed; where
    the cells carry gold shares (a ranking metric) the row judges the share."""
    from mechlingo.card.stages import transfer

    n = 10
    draws = [[0.0] * n for _ in range(20)]
    cells = [_cell(f"all_but_{c}", c, n, [0.0] * n, [1.0] * n, draws) for c in ("a", "b")]
    (gain, _) = transfer.rows_transfer(claims.INDEPENDENT_RELATIONS, {"cells": cells})
    assert gain["vs_control"]["extra"]["draws"] == 20
    assert gain["vs_control"]["p"] == pytest.approx(1 / 21)
    assert gain["outcome"] == "accuracy"
    sh = {"orig": [0.3] * n, "steered": [0.55] * n, "controls": [[0.3] * n] * 20}
    cells = [_cell(f"all_but_{c}", c, n, [1.0] * n, [1.0] * n, draws, sh) for c in ("a", "b")]
    (gain, _) = transfer.rows_transfer(claims.INDEPENDENT_RELATIONS, {"cells": cells})
    assert gain["value"]["estimate"]["estimate"] == pytest.approx(0.25)
    assert gain["outcome"] == "gold share" and "gold" in gain["measure"]

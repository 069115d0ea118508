"""The claims card's data and further rows: the bundled natural parallel text and its split, the
BMLAMA-style candidates, the new row builders on hand-made stage JSON (values against hand
computations and scipy), and a ``--facts DIR`` card on an invented BMLAMA-format fixture."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats as sps

from mechlingo.card import repair_items
from mechlingo.card.clustered_tests import cluster_bootstrap, group_difference_test
from mechlingo.card.rules import CLAIMS, INCONCLUSIVE, NOT_TESTABLE
from mechlingo.card.stages import align, conversion, data, decoders, external, repair
from mechlingo.card.stages.experts import rank_test
from mechlingo.card.stages.repair import config_sentence
from mechlingo.core.errors import InputError
from mechlingo.data import LANGS, Fact, parallel_sentences
from mechlingo.data.candidates import with_candidates
from mechlingo.data.natural_parallel import (
    bundled_documents,
    bundled_parallel,
    document_clusters,
    split_by_documents,
)
from mechlingo.scoring.scorers import rankc_fact

FIXTURE = Path(__file__).parents[2] / "fixtures" / "bmlama_invented"

#: A key-value template line: two or more "Label: value" pairs ("País: Afganistán Capital:
#: Kabul"), the shape of the bundled tuned prompts joined into one line.
KEY_VALUE = re.compile(r"^\s*(?:[^\s:：\d][^:：\d]{0,30}[:：]\s*[^:：]{1,60}?\s*){2,}$")


# --------------------------------------------------------------------------------------
# The bundled natural parallel text
# --------------------------------------------------------------------------------------


def test_no_default_parallel_line_is_a_key_value_template():
    old = parallel_sentences(["en", "es", "de"], relations=["capital"], limit=30)
    templated = [line for lines in old.values() for line in lines if KEY_VALUE.match(line)]
    assert len(templated) >= 30  # the pattern does catch the old default's lines
    assert KEY_VALUE.match("País: Afganistán Capital: Kabul")
    new = bundled_parallel()
    assert list(new) == list(LANGS)
    bad = [
        (lg, i, s) for lg, lines in new.items() for i, s in enumerate(lines) if KEY_VALUE.match(s)
    ]
    assert bad == []
    assert not KEY_VALUE.match(new["en"][129])  # "Watch: Liverpool's ..." has one label only


def test_bundled_ntrex_is_aligned_attributed_and_licensed():
    texts, docs = bundled_parallel(), bundled_documents()
    assert {len(v) for v in texts.values()} == {len(docs)} == {1005}
    assert len(set(docs)) == 63  # the development split shipped whole
    assert all(s.strip() for v in texts.values() for s in v)
    assert texts["en"][0] == "Welsh AMs worried about 'looking like muppets'"
    folder = Path(data.__file__).parents[2] / "data" / "ntrex"
    notice = (folder / "LICENSE.md").read_text()
    readme = (folder / "README.md").read_text()
    assert "https://creativecommons.org/licenses/by-sa/4.0/" in notice
    assert "CC BY-SA 4.0" in readme and "Federmann" in readme and "8561f6a" in readme
    # whole documents only: the last line ends its document in the source's numbering
    assert docs[-1] == "rt.com.91335" and docs.count("rt.com.91335") == 17
    assert docs.count("reuters.218888") == 19  # the old subset's last document, whole


def test_split_by_documents_never_shares_a_document():
    docs = ["a"] * 5 + ["b"] * 3 + ["c"] * 4 + ["d"] * 2 + ["e"] * 6
    parts = split_by_documents(docs, [6, 2, 5], [None, None, 2])
    # part 0: all of a, one line of b (b is then spent); part 1: c's first 2 (c spent);
    # part 2: at most 2 per document: d, d, e, e
    assert parts == [[0, 1, 2, 3, 4, 5], [8, 9], [12, 13, 14, 15]]
    used = [{docs[i] for i in p} for p in parts]
    assert not (used[0] & used[1]) and not (used[1] & used[2]) and not (used[0] & used[2])
    with pytest.raises(InputError, match="too few"):
        split_by_documents(docs, [18, 1, 1])
    assert document_clusters(["x", "x", "y", "x"]) == [0, 0, 1, 0]


def test_parallel_parts_of_the_budgets():
    from mechlingo.card.replicate import budget_settings

    for budget in ("quick", "full"):
        cfg = budget_settings(budget)
        parts = data.parallel_parts(None, cfg)
        e = cfg["experts"]
        assert len(parts["find"]["en"]) == e["n_find"] and len(parts["eval"]["es"]) == e["n_eval"]
        docs = parts["docs"]
        assert not set(docs["find"]) & set(docs["eval"])
        assert not set(docs["heldout"]) & set(docs["eval"])
        assert len(set(docs["eval"])) >= 8  # enough documents to cluster on
        assert max(docs["eval"].count(d) for d in docs["eval"]) <= e["eval_per_doc"]


# --------------------------------------------------------------------------------------
# Candidates
# --------------------------------------------------------------------------------------


def _f(fid, lang, answer, aliases=()):
    return Fact(fid, "capital", lang, fid, f"Q {fid}", answer, aliases=tuple(aliases))


def test_candidates_are_aligned_by_fact_id_and_distinct():
    facts = [
        _f("c/A", "en", "Aa"),
        _f("c/A", "fr", "Aa-fr"),
        _f("c/B", "en", "Bb"),
        _f("c/B", "fr", "Aa-fr"),  # same French name as A's answer
        _f("c/C", "en", "Cc"),
        _f("c/C", "fr", "Cc-fr"),
        _f("c/D", "en", "Dd"),
        _f("c/D", "fr", "Dd-fr"),
    ]
    out = {(f.id, f.lang): f for f in with_candidates(facts, 3)}
    a_en, a_fr = out[("c/A", "en")].candidates, out[("c/A", "fr")].candidates
    # B collides with A's answer in French, so A's distractors are C and D, ordered by id
    assert a_en == ("Aa", "Cc", "Dd") and a_fr == ("Aa-fr", "Cc-fr", "Dd-fr")
    for f in out.values():
        assert f.answer in f.candidates and len(set(f.candidates)) == 3
        other = out[(f.id, "fr" if f.lang == "en" else "en")]
        assert f.candidates.index(f.answer) == other.candidates.index(other.answer)
    with pytest.raises(InputError, match="too few distinct"):
        with_candidates(facts, 5)


def test_gold_logshare_by_hand():
    rec = {
        "scores": [1.0, 2.0, 3.0],
        "candidates": ["x", "y", "z"],
        "answer": "y",
        "ranking": [0, 1, 2],
        "gold_rank": 2,
    }
    expect = -2.0 - math.log(math.exp(-1) + math.exp(-2) + math.exp(-3))
    assert repair_items._gold_logshare(rec) == pytest.approx(expect)


# --------------------------------------------------------------------------------------
# Row builders on hand-made stage JSON
# --------------------------------------------------------------------------------------


def _items(cond_correct, ranking=None):
    """``{cond: [{id, lang, correct}]}`` from ``{cond: {(id, lang): 0/1}}``."""
    out = {}
    for cond, d in cond_correct.items():
        out[cond] = [
            {
                "id": i,
                "lang": lg,
                "correct": bool(v),
                **({"ranking": ranking[cond][(i, lg)], "logshare": -1.0 + v} if ranking else {}),
            }
            for (i, lg), v in sorted(d.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        ]
    return out


IDS = [f"f{k}" for k in range(8)]


def _cond(en, fr, es):
    d = {}
    for k, i in enumerate(IDS):
        d[(i, "en")], d[(i, "fr")], d[(i, "es")] = en[k], fr[k], es[k]
    return d


ORIG = _cond([1, 1, 1, 1, 1, 1, 0, 1], [0, 0, 1, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 0, 0, 0])
TASK = _cond([1] * 8, [1, 1, 1, 0, 0, 1, 0, 0], [1, 0, 0, 0, 1, 0, 0, 0])
DIFF = _cond([1] * 8, [0, 0, 1, 1, 0, 1, 0, 0], [0, 0, 0, 0, 1, 0, 0, 1])
BOTH = _cond([1] * 8, [1, 1, 1, 1, 0, 1, 1, 0], [1, 0, 1, 0, 1, 0, 0, 1])
RND = _cond([1] * 8, [0, 0, 1, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 0, 0, 0])
CLASSES = {
    f"{i}|{lg}": ("recall_failure" if k < 4 else "translation_failure")
    for k, i in enumerate(IDS)
    for lg in ("fr", "es")
}


def _repair_data():
    items = _items({"orig": ORIG, "task": TASK, "diff": DIFF, "both": BOTH, "random_s0": RND})
    return {"items": items, "classes": CLASSES, "sweep": {"best_single": "task"}}


def test_repair_extra_rows_by_hand():
    rows = {r["id"]: r for r in repair.rows_repair_extra(_repair_data())}
    assert set(rows) == {
        "english_gap",
        "consistency",
        "task_repairs_recall",
        "both_beat_single",
    }
    # gap: mean over the 16 (fact, L) pairs of en - L
    gap = np.mean([ORIG[(i, "en")] - ORIG[(i, lg)] for i in IDS for lg in ("fr", "es")])
    assert rows["english_gap"]["value"]["estimate"]["estimate"] == pytest.approx(gap)
    assert rows["english_gap"]["value"]["n_clusters"] == 8
    # a difference in differences: (task - diff) on recall failures (f0-f3) minus on
    # translation failures (f4-f7); the diff vector's own-class contrast is the same number,
    # so it has no row of its own
    g = {k: TASK[k] - DIFF[k] for k in TASK if k[1] != "en"}
    rf = np.mean([v for (i, _), v in g.items() if IDS.index(i) < 4])
    tf = np.mean([v for (i, _), v in g.items() if IDS.index(i) >= 4])
    assert rows["task_repairs_recall"]["value"]["estimate"]["estimate"] == pytest.approx(rf - tf)
    assert rows["task_repairs_recall"]["value"]["n_clusters"] == 8
    assert "difference in differences" in rows["task_repairs_recall"]["details"]
    # both vs the dev-better single vector (task)
    bb = np.mean([BOTH[k] - TASK[k] for k in BOTH if k[1] != "en"])
    assert rows["both_beat_single"]["value"]["estimate"]["estimate"] == pytest.approx(bb)

    # consistency (no rankings): CLC = |both right| / |either right| with English, after -
    # before, minus the change that independent answers at the same accuracies would give
    def clc(c):
        pairs = [(c[(i, lg)], c[(i, "en")]) for i in IDS for lg in ("fr", "es")]
        return sum(a and b for a, b in pairs) / sum(a or b for a, b in pairs)

    def null(c):  # per language: p_L p_en / (p_L + p_en - p_L p_en), items weighted
        num = den = 0.0
        for lg in ("fr", "es"):
            pl = np.mean([c[(i, lg)] for i in IDS])
            pe = np.mean([c[(i, "en")] for i in IDS])
            num, den = num + 8 * pl * pe, den + 8 * (pl + pe - pl * pe)
        return num / den

    assert rows["consistency"]["value"]["estimate"]["estimate"] == pytest.approx(
        clc(BOTH) - clc(ORIG) - (null(BOTH) - null(ORIG))
    )
    assert rows["consistency"]["consistency"] == "CLC"


def test_consistency_is_rankc_under_rank():
    rank = {
        c: {k: ([0, 1, 2] if v else [1, 0, 2]) for k, v in d.items()}
        for c, d in (("orig", ORIG), ("both", BOTH))
    }
    items = _items({"orig": ORIG, "both": BOTH}, rank)
    row = repair.row_consistency(items, "both")
    pre = [
        rankc_fact(rank["orig"][(i, "en")], rank["orig"][(i, lg)])
        for i in IDS
        for lg in ("es", "fr")
    ]
    post = [
        rankc_fact(rank["both"][(i, "en")], rank["both"][(i, lg)])
        for i in IDS
        for lg in ("es", "fr")
    ]
    # net of accuracy: only the items whose correctness (L and English) does not change
    keep = [j for j, (i, lg) in enumerate((i, lg) for i in IDS for lg in ("es", "fr"))
            if ORIG[(i, lg)] == BOTH[(i, lg)] and ORIG[(i, "en")] == BOTH[(i, "en")]]  # fmt: skip
    want = np.mean([post[j] for j in keep]) - np.mean([pre[j] for j in keep])
    assert row["value"]["estimate"]["estimate"] == pytest.approx(want)
    assert want == 0  # here the rankings follow correctness: no consistency beyond accuracy
    assert row["consistency"] == "RankC" and "raw change" in row["details"]
    lp = repair.logprob_gain(items, "both")  # logshare = correct - 1
    assert lp.estimate.estimate == pytest.approx(
        np.mean([BOTH[k] - ORIG[k] for k in BOTH if k[1] != "en"])
    )


def test_own_failure_is_not_testable_without_classes():
    data = _repair_data()
    data["classes"] = None
    rows = {r["id"]: r for r in repair.rows_repair_extra(data)}
    assert rows["task_repairs_recall"]["verdict"] == NOT_TESTABLE


def test_attach_logprob_adds_the_gain_to_accuracy_rows():
    rank = {c: {k: [0, 1] for k in d} for c, d in (("orig", ORIG), ("task", TASK))}
    rank["both"] = rank["task"]
    items = _items({"orig": ORIG, "task": TASK, "both": BOTH}, rank)
    rows = [
        {"id": "task_vector", "details": "x"},
        {"id": "lowest_language"},
        {"id": "lowest_language", "langs": ["fr"]},
    ]
    repair.attach_logprob(rows, {"items": items})
    gain = np.mean([TASK[k] - ORIG[k] for k in TASK if k[1] != "en"])
    assert rows[0]["logprob_gain"]["estimate"]["estimate"] == pytest.approx(gain)
    assert "gold log-share" in rows[0]["details"] and "logprob_gain" not in rows[1]
    fr = np.mean([BOTH[k] - ORIG[k] for k in BOTH if k[1] == "fr"])
    assert rows[2]["logprob_gain"]["estimate"]["estimate"] == pytest.approx(fr)


def test_decoder_rows_by_hand():
    items = [{"id": f"f{k}", "lang": "fr", "en_first": k < 6} for k in range(8)]
    data = {
        "decoders": {
            "logit": {"items": items},
            "tuned": {"untestable": "no lens"},
            "patchscope": {"items": items},
        }
    }
    rows = {r["id"]: r for r in decoders.rows_decoders(data)}
    # the logit lens re-reads latent_english's trace records: no second row of it
    assert set(rows) == {"latent_english_tuned", "latent_english_patchscope"}
    assert rows["latent_english_patchscope"]["value"]["estimate"]["estimate"] == pytest.approx(
        6 / 8
    )
    assert rows["latent_english_patchscope"]["per_lang"] == {"fr": [6, 8]}
    assert rows["latent_english_tuned"]["verdict"] == NOT_TESTABLE
    data["decoders"]["patchscope"] = {"items": []}
    (_, empty) = decoders.rows_decoders(data)
    assert empty["verdict"] == NOT_TESTABLE


def test_conversion_band_and_row_by_hand():
    trace = {
        "n_layers": 10,
        "records": [
            {"lang": "fr", "first_answer_layer": 7},
            {"lang": "fr", "first_answer_layer": 9},
            {"lang": "fr", "first_answer_layer": -1},
            {"lang": "ja", "first_answer_layer": -1},
        ],
    }
    assert conversion.conversion_band(trace, "fr") == [7, 8, 9]  # median 8, minus one
    assert conversion.conversion_band(trace, "ja") is None
    data = {
        "langs": {
            "fr": {
                "band": [7, 8, 9],
                "ids": ["a", "b", "c"],
                "band_effect": [1.0, 2.0, 0.5],
                "control_effect": [0.1, 0.0, 0.2],
            },
            "ja": {"untestable": "no conversion band"},
        }
    }
    (row,) = conversion.rows_conversion(data)
    assert row["value"]["estimate"]["estimate"] == pytest.approx(3.5 / 3)
    assert row["vs_control"]["estimate"]["estimate"] == pytest.approx((3.5 - 0.3) / 3)
    assert "ja: no conversion band" in row["details"]


def test_external_rows_by_hand():
    items = _items(
        {
            "orig": ORIG,
            "task": TASK,
            "diff": DIFF,
            "both": BOTH,
            "random_s0": RND,
            "random_s1": ORIG,
        }
    )
    rows = {r["id"]: r for r in external.rows_external({"items": items, "metric": "rank"})}
    ne = [k for k in ORIG if k[1] != "en"]
    ctl = np.mean([(RND[k] + ORIG[k]) / 2 - ORIG[k] for k in ne])
    assert rows["external_both"]["value"]["estimate"]["estimate"] == pytest.approx(
        np.mean([BOTH[k] - ORIG[k] for k in ne])
    )
    assert rows["external_both"]["control"]["estimate"]["estimate"] == pytest.approx(ctl)
    none = external.rows_external({"untestable": "no benchmark"})
    assert [r["verdict"] for r in none] == [NOT_TESTABLE] * 3


def _align_details():
    """3 languages (6 ordered pairs), 8 sentences in 4 documents, hand-set hits/distances."""
    rng = np.random.default_rng(0)
    pairs = [f"{a}->{b}" for a in "xyz" for b in "xyz" if a != b]
    pre_h = rng.integers(0, 2, (6, 8)).astype(float)
    pre_h[:, 0] = 1  # every pair has a pre hit
    post_h = np.clip(pre_h + (rng.random((6, 8)) < 0.3), 0, 1)
    ctl_h = pre_h.copy()
    pre_d = rng.random((6, 8))
    post_d = pre_d - 0.1 * (post_h - pre_h) - 0.01
    d = {"pairs": pairs, "docs": ["a", "a", "b", "b", "c", "c", "d", "d"]}
    for arm, h, dist in (
        ("pre", pre_h, pre_d),
        ("post", post_h, post_d),
        ("control", ctl_h, pre_d),
    ):
        d[arm] = {
            "hits": h.tolist(),
            "dist": dist.tolist(),
            "ratio_centred": (dist.mean(0) + 0.5).tolist(),
        }
    return d, pre_h, post_h, pre_d, post_d


def test_align_extra_rows_by_hand():
    d, pre_h, post_h, pre_d, post_d = _align_details()
    rows = {r["id"]: r for r in align.rows_align_extra({"details": d})}
    ratio = post_h.mean(1) / pre_h.mean(1)
    assert rows["retrieval_gain_max"]["value"]["estimate"]["estimate"] == pytest.approx(ratio.max())
    assert rows["retrieval_gain_median"]["value"]["estimate"]["estimate"] == pytest.approx(
        np.median(ratio) - 1
    )
    assert rows["retrieval_gain_max"]["control"]["estimate"]["estimate"] == pytest.approx(1.0)
    # against the random clamp's own maximum (here 1.0): one draw, the permutation floor 1/2
    vs = rows["retrieval_gain_max"]["vs_control"]
    assert vs["p"] == 0.5 and vs["estimate"]["estimate"] == pytest.approx(ratio.max() - 1.0)
    assert rows["retrieval_gain_max"]["verdict"] == INCONCLUSIVE
    # a population of random clamps, one of them with a larger maximum than the clamp's
    big = {**d["control"], "hits": np.clip(pre_h * 0 + 1, 0, 1).tolist()}
    d2 = {**d, "controls": [d["control"]] * 3 + [big]}
    vs2 = {r["id"]: r for r in align.rows_align_extra({"details": d2})}["retrieval_gain_max"]
    draw_max = max((1 / pre_h.mean(1)).max(), 1.0)
    want = (1 + sum(x >= ratio.max() for x in [1.0, 1.0, 1.0, draw_max])) / 5
    assert vs2["vs_control"]["extra"]["p_rank"] == pytest.approx(want)
    assert vs2["vs_control"]["extra"]["draws"] == 4
    # a maximum is judged by its rank alone (maxima are far from normal), not by a t test
    assert vs2["vs_control"]["p"] == pytest.approx(want)
    assert vs2["vs_control"]["extra"]["one_sided"] is True
    assert vs2["p_against"] is not None and vs2["p"] >= want
    rho = sps.spearmanr(post_d.mean(1) - pre_d.mean(1), post_h.mean(1) - pre_h.mean(1))
    assert rows["distance_predicts_retrieval"]["value"]["estimate"]["estimate"] == (
        pytest.approx(rho.statistic)
    )

    assert rows["distance_predicts_retrieval"]["value"]["n_clusters"] == 4
    closer = rows["clamp_closer_centred"]["value"]
    assert closer["estimate"]["estimate"] == pytest.approx(np.mean(post_d.mean(0) - pre_d.mean(0)))
    assert closer["n_clusters"] == 4
    assert all(
        r["verdict"] == NOT_TESTABLE for r in align.rows_align_extra({"untestable": "no clamp"})
    )


def test_rank_test_by_hand():
    """15 against draws 4, 3, 5, 4: estimate 15 - 4 = 11; rank p (1 + 0) / 5 = 0.2; the t
    p from the prediction SE sd * sqrt(1 + 1/4) on 3 df; ``exact`` keeps the rank p alone."""
    draws = [4.0, 3.0, 5.0, 4.0]
    t = rank_test(15.0, draws)
    se = np.std(draws, ddof=1) * np.sqrt(1 + 1 / 4)
    assert t.estimate.estimate == pytest.approx(11.0)
    assert t.p == pytest.approx(2 * sps.t.sf(11.0 / se, 3))
    assert t.extra["p_rank"] == pytest.approx(0.2) and t.extra["p_floor"] == pytest.approx(0.2)
    e = rank_test(15.0, draws, exact=True)
    assert e.p == pytest.approx(0.2) and e.extra["one_sided"] is True
    assert e.extra["p_opposite"] == pytest.approx(1.0)
    assert e.estimate.lo == pytest.approx(t.estimate.lo)  # the same interval
    # a tie with the effect counts as "at least as far": 4 against 4, 3, 5, 4 -> (1 + 3) / 5
    assert rank_test(4.0, draws, exact=True).p == pytest.approx(0.8)


def test_sentence_values_against_a_direct_computation():
    import torch

    g = torch.Generator().manual_seed(0)
    emb = torch.randn(3, 5, 4, generator=g)
    v = align.sentence_values(emb)
    x = torch.nn.functional.normalize(emb.double(), dim=-1)
    cos01 = (x[0] * x[1]).sum(-1)
    assert np.allclose(v["dist"][0], (1 - cos01).tolist())  # pair x->y is (0, 1)
    hit = [(x[0, i] @ x[1].T).argmax().item() == i for i in range(5)]
    assert v["hits"][0] == [float(h) for h in hit]
    c = emb.double() - emb.double().mean(dim=(0, 1), keepdim=True)
    xc = torch.nn.functional.normalize(c, dim=-1)
    same = 1 - (xc[0] * xc[1]).sum(-1)
    other = torch.stack([(1 - xc[0, i] @ xc[1].T).sum() - same[i] for i in range(5)]) / 4
    assert len(v["ratio_centred"]) == 5
    # the mean over the 6 pairs includes (0, 1); check that term's contribution exactly
    terms = []
    for a in range(3):
        for b in range(3):
            if a != b:
                s = 1 - (xc[a] * xc[b]).sum(-1)
                o = torch.stack([(1 - xc[a, i] @ xc[b].T).sum() - s[i] for i in range(5)]) / 4
                terms.append(s / o)
    assert np.allclose(v["ratio_centred"], torch.stack(terms).mean(0).tolist())
    assert np.allclose(terms[0].tolist(), (same / other).tolist())


def test_cluster_bootstrap_and_group_difference():
    data = np.array([[1.0], [1.0], [0.0], [0.0], [1.0], [0.0]])
    t = cluster_bootstrap(data, ["a", "a", "b", "b", "c", "c"], lambda m: float(m.mean()), null=0.5)
    assert t.estimate.estimate == pytest.approx(0.5) and t.n_clusters == 3
    assert t.estimate.lo < 0.5 < t.estimate.hi and t.extra["df"] == 2  # t(G - 1), widened
    gd = group_difference_test(
        [1, 1, 0, 0, 5], ["a", "a", "b", "b", "z"], [1, 2, 3, 4, 5], "a", "b"
    )
    assert gd.estimate.estimate == pytest.approx(1.0) and gd.estimate.n == 4


def test_new_claims_are_appended_with_their_stages():
    ids = [c.id for c in CLAIMS]
    assert len(ids) == len(set(ids)) >= 20
    stages = {c.stage for c in CLAIMS}
    assert {"decoders", "conversion", "external"} <= stages


# --------------------------------------------------------------------------------------
# An --external DIR card on the invented BMLAMA fixture (tiny model, tiny settings)
# --------------------------------------------------------------------------------------


def test_external_benchmark_adds_external_rows(tiny_dir, tmp_path, monkeypatch):
    from mechlingo.cli import main
    from tests.card.test_replicate import TINY, _fake_transfer

    monkeypatch.setitem(sys.modules, "mechlingo.analyses.recall.transfer", _fake_transfer())
    settings = {
        **TINY,
        "decoders": {"per_lang": 2},
        "conversion": {"langs": ["fr"], "n_prompts": 2},
    }
    out = tmp_path / "out"
    args = [
        "replicate",
        "--model",
        str(tiny_dir),
        "--paper",
        "lu2025",
        "--external",
        str(FIXTURE),
        "--settings",
        json.dumps(settings),
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(args) == 0
    card = json.loads((out / "claims.json").read_text())
    rows = {r["id"]: r for r in card["claims"]}
    ext = card["meta"]["settings"]
    # the bundled stages' metric is the metric rule's decision on dev (no --metric given)
    assert ext["metric"] == card["metric_decision"]["metric"] in ("generate", "rank")
    for cid in ("external_task", "external_diff", "external_both"):
        r = rows[cid]
        assert r["verdict"] != "error" and r["verdict"] != NOT_TESTABLE, r
        # 8 invented facts x 3 languages, non-English items clustered by fact id
        assert r["value"]["estimate"]["n"] == 16 and r["value"]["n_clusters"] == 8
        assert r["control"] is not None and r["vs_control"] is not None
        assert "metric rank" in r["details"] and r["outcome"] == "gold share"
        # each condition against its own population of the repair stage's random seeds
        assert r["vs_control"]["extra"]["draws"] == len(TINY["repair"]["seeds"])
    for cid in ("latent_english", "latent_english_patchscope", "conversion_causal"):
        assert rows[cid]["verdict"] != "error", rows[cid]
    assert rows["latent_english_tuned"]["verdict"] == NOT_TESTABLE
    page = (out / "report.html").read_text()
    for r in card["claims"]:  # every row links to a section of the report
        assert f"id='{r['figure']}'" in page, r["figure"]
    assert "Dev chose" in page and "with alpha" in page


def test_config_sentence():
    s = {
        "config": {"task_layer": 12, "task_alpha": 0.28, "diff_layer": 6, "diff_alpha": 0.13},
        "selected": "both",
        "dev_effect": "beats no intervention",
        "alpha_unit": "resid",
        "metric": {"metric": "rank"},
    }
    text = config_sentence(s, {"build": 40, "dev": 10, "test": 24})
    assert text == (
        "Dev chose both vectors together (beats no intervention on dev): the task vector at "
        "layer 12 with alpha 0.28 and the back-translation vector at layer 6 with alpha 0.13 "
        "(residual-norm units); scored by rank; built on 40 fact ids, chosen on 10, tested on 24."
    )

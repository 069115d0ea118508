"""The transfer matrix, relation-pooled vectors and the headroom rule of the lowest language."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import scipy.stats as sps
import torch

from mechlingo.analyses.recall import dev_grid, group_vectors, transfer
from mechlingo.analyses.recall.dev_grid import LeakError, lowest_language_rule
from mechlingo.analyses.recall.settings import BuildSettings, MatrixSettings, ScoringOptions
from mechlingo.analyses.recall.steering import SteeringPair, build_steering_vectors
from mechlingo.data import RELATIONS, load_facts
from mechlingo.data.splits import split_facts

RELS = ["capital", "language", "currency"]  # in RELATIONS order
SMALL = {
    "matrix": MatrixSettings(
        build_ids=3, screen_ids=2, dev_ids=2, test_ids=2, layers=(0, 1), alphas=(0.5,)
    ),
    "build": BuildSettings(k_shot=2),
    "scoring": ScoringOptions(max_new_tokens=2),
}


@pytest.fixture(scope="module")
def facts():
    return load_facts(langs=["en", "fr", "de"], relations=RELS, limit=24, templates="natural")


# --------------------------------------------------------------------------------------
# The headroom rule, on hand-made accuracy tables
# --------------------------------------------------------------------------------------


def _pairs(n, zero_right, fixed, broken=0):
    """``n`` paired items: ``zero_right`` right zero-shot (``broken`` of them wrong with
    demonstrations), and ``fixed`` of the wrong ones right with demonstrations."""
    zero = [True] * zero_right + [False] * (n - zero_right)
    few = list(zero)
    for i in range(broken):
        few[i] = False
    for i in range(fixed):
        few[zero_right + i] = True
    return zero, few


def test_headroom_rule_on_hand_made_tables():
    table = {
        "en": _pairs(20, 3, 15),  # the most headroom, but never the lowest language
        "ko": _pairs(20, 0, 0),  # 3-shot 0/20 too: no headroom
        "hi": _pairs(20, 0, 1),  # fixed 1, broken 0: p = 1
        "ru": _pairs(20, 1, 8),  # p = 2 * 0.5**8
        "fr": _pairs(20, 2, 10),  # headroom, but a higher zero-shot accuracy than ru
        "de": _pairs(20, 1, 4),  # fixed 4, broken 0: p = 0.125, just above 0.1
        "es": _pairs(20, 1, 5),  # fixed 5, broken 0: p = 0.0625, just below 0.1
        "it": _pairs(20, 5, 0, broken=5),  # demonstrations hurt: p = 0.0625 the wrong way
    }
    zero = {lg: z for lg, (z, _) in table.items()}
    few = {lg: f for lg, (_, f) in table.items()}
    out = lowest_language_rule(zero, few)
    # ru and es both have headroom and tie at 1/20 zero-shot; the tie goes to the lower
    # few-shot accuracy (es 6/20 < ru 9/20)
    assert out["language"] == "es"
    assert out["tests"]["ru"]["p"] == pytest.approx(2 * 0.5**8)
    assert out["tests"]["es"]["p"] == pytest.approx(sps.binomtest(5, 5).pvalue)
    assert out["literal"] == "ko"  # 0/20 zero-shot, and the lower few-shot accuracy than hi
    assert out["excluded"] == ["de", "hi", "it", "ko"]
    assert not out["tests"]["it"]["headroom"] and out["tests"]["en"]["headroom"]
    strict = lowest_language_rule(zero, few, p_threshold=0.01)
    assert strict["language"] == "ru" and "es" in strict["excluded"]
    none = lowest_language_rule(
        {"en": [True, False], "ko": [False] * 4}, {"en": [True, True], "ko": [False] * 4}
    )
    assert none["language"] is None and none["literal"] == "ko" and none["excluded"] == ["ko"]
    with pytest.raises(ValueError, match="paired"):
        lowest_language_rule({"fr": [True]}, {"fr": [True, False]})


# --------------------------------------------------------------------------------------
# Building once per (relation, language) group
# --------------------------------------------------------------------------------------


def test_pooled_vectors_equal_building_on_the_pooled_facts(tiny, facts):
    build = split_facts(facts)["build"]
    stats = group_vectors.group_stats(tiny, build, k_shot=2, translation_shots=0)
    for rels in (RELS, ["currency"]):
        sel = [f for f in build if f.relation in rels]
        ref = build_steering_vectors(tiny, sel, BuildSettings(k_shot=2, translation_shots=0))
        got = group_vectors.pooled_vectors(stats, relations=rels, model=tiny)
        for name in ("few_shot", "zero_shot", "translation"):
            torch.testing.assert_close(got.means[name], ref.means[name], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.task.vector, ref.task.vector, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got.diff.vector, ref.diff.vector, rtol=1e-4, atol=1e-4)
        assert got.build["n_prompts"] == ref.build["n_prompts"]
        assert got.build["fact_ids"] == ref.build["fact_ids"]
        assert got.relations == [r for r in RELATIONS if r in rels]
    no_fr = group_vectors.pooled_vectors(stats, langs=["en", "de"])
    assert no_fr.build["langs"] == ["de", "en"]
    assert no_fr.build["n_prompts"]["zero_shot"] == sum(f.lang != "fr" for f in build)


def test_balance_relations_same_ids_per_relation(facts):
    out = group_vectors.balance_relations(facts)
    per = {r: {f.id for f in out if f.relation == r} for r in RELS}
    assert {len(v) for v in per.values()} == {24}
    three = group_vectors.balance_relations(facts, 3)
    assert len(three) == 3 * 3 * 3 and {f.lang for f in three} == {"en", "fr", "de"}


def test_old_vector_artifacts_load_without_relations(tiny, facts, tmp_path):
    v = build_steering_vectors(
        tiny, split_facts(facts)["build"][:24], BuildSettings(k_shot=1, translation_shots=0)
    )
    v.build.pop("relations")
    v.save(tmp_path / "v", tiny)
    back = SteeringPair.load(tmp_path / "v", tiny)
    assert back.relations is None and back.unit == "resid"


# --------------------------------------------------------------------------------------
# The matrix on the tiny model, watched for leaks
# --------------------------------------------------------------------------------------


def _watch(monkeypatch):
    seen = {"pooled": [], "sweep": [], "test": [], "kw": []}
    real_pool, real_sweep, real_score = (
        group_vectors.pooled_vectors,
        dev_grid.choose_on_dev,
        dev_grid.score,
    )
    real_row_score = transfer._Run.score

    def pooled_fn(stats, **kw):
        v = real_pool(stats, **kw)
        seen["pooled"].append((kw.get("relations"), kw.get("langs"), set(v.build["fact_ids"])))
        return v

    def sweep(model, vectors, dev, *a, **kw):
        seen["sweep"].append(list(dev))
        return real_sweep(model, vectors, dev, *a, **kw)

    def score(model, facts, iv, **kw):
        seen["kw"].append(kw.pop("marker", None))
        return real_score(model, facts, iv, **kw)

    def row_score(self, facts, iv):
        seen["test"].append(list(facts))
        return real_row_score(self, facts, iv)

    monkeypatch.setattr(group_vectors, "pooled_vectors", pooled_fn)
    monkeypatch.setattr(dev_grid, "choose_on_dev", sweep)
    monkeypatch.setattr(dev_grid, "score", score)
    monkeypatch.setattr(transfer._Run, "score", row_score)
    return seen


def _check_cells(m):
    for c in m.cells:
        assert c["n"] > 0 and 0 <= c["p"] <= 1 and 0 <= c["control_p"] <= 1
        for key in ("gain", "control_gain"):
            g = c[key]
            assert None not in (g["estimate"], g["lo"], g["hi"])
            assert g["lo"] - 1e-9 <= g["estimate"] <= g["hi"] + 1e-9
        acc = c["accuracy"]
        assert c["gain"]["estimate"] == pytest.approx(acc["steered"] - acc["orig"])
        assert c["control_gain"]["estimate"] == pytest.approx(acc["control"] - acc["orig"])
        assert c["selected"] in ("task", "diff", "both") and "layer" in c and "alpha" in c


def test_matrix_by_relation_cells_and_no_leak(tiny, facts, monkeypatch):
    seen = _watch(monkeypatch)
    m = transfer.transfer_matrix(tiny, facts, by="relation", marker="m", **SMALL)
    rows = ["all"] + [f"all_but_{r}" for r in RELS] + [f"only_{r}" for r in RELS]
    assert m.rows == rows and m.cols == RELS and len(m.cells) == 3 + 3 + 9
    _check_cells(m)
    assert seen["kw"] and set(seen["kw"]) == {"m"}  # every scoring call got the keyword
    test_ids = {f.id for f in split_facts(facts, (0.4, 0.2, 0.4))["test"]}
    assert len(seen["pooled"]) == len(seen["sweep"]) == len(rows)
    for row, (rels, _, built), dev in zip(rows, seen["pooled"], seen["sweep"], strict=True):
        assert not built & test_ids and not {f.id for f in dev} & test_ids
        used = {i.split("/")[0] for i in built} | {f.relation for f in dev}
        if row.startswith("all_but_"):
            assert row[len("all_but_") :] not in used  # never built or chosen on R
        elif row.startswith("only_"):
            assert used == {row[len("only_") :]}
        assert rels is not None and used == set(rels)
    for t in seen["test"]:  # each test call: one relation, non-English, test split
        assert len({f.relation for f in t}) == 1 and "en" not in {f.lang for f in t}
        assert {f.id for f in t} <= test_ids
    df = m.to_dataframe()
    assert len(df) == 15 and {"gain_lo", "control_gain_hi"} <= set(df.columns)
    doc = json.loads(json.dumps(m.to_json()))
    assert doc["summary"]["all_but"]["cells"] == 3 and doc["summary"]["only_other"]["cells"] == 6
    assert "<table>" in m._repr_html_() and len(m.fig_transfer().data) == 1
    diag = transfer.transfer_matrix(
        tiny,
        facts,
        by="relation",
        **{**SMALL, "matrix": replace(SMALL["matrix"], cells="diagonal", held_out=("capital",))},
    )
    assert [(c["row"], c["col"]) for c in diag.cells] == [
        ("all", "capital"),
        ("all_but_capital", "capital"),
        ("only_capital", "capital"),
    ]


def test_matrix_by_language_never_sees_the_held_out_language(tiny, facts, monkeypatch, tmp_path):
    seen = _watch(monkeypatch)
    m = transfer.transfer_matrix(tiny, facts, by="lang", **SMALL)
    assert m.rows == ["all", "all_but_de", "all_but_fr"] and m.cols == ["de", "fr"]
    assert [(c["row"], c["col"]) for c in m.cells] == [
        ("all", "de"),
        ("all", "fr"),
        ("all_but_de", "de"),
        ("all_but_fr", "fr"),
    ]
    _check_cells(m)
    for row, (_, langs, _), dev in zip(m.rows, seen["pooled"], seen["sweep"], strict=True):
        dev_langs = {f.lang for f in dev}
        if row == "all":
            assert langs == ("en", "de", "fr") and dev_langs == {"en", "de", "fr"}
        else:
            held = row[len("all_but_") :]
            assert held not in langs and held not in dev_langs and "en" in dev_langs
    assert m.choices["all_but_fr"]["langs"] == ["en", "de"]
    # the result of steer eval --transfer: summary() is the JSON, write() a summary.json
    both = transfer.TransferMatrices({"lang": m}, ["by relation: skipped"])
    assert both.summary() == {"notes": ["by relation: skipped"], "lang": m.to_json()}
    out = both.write(tmp_path / "t", meta={"x": 1})
    doc = json.loads((out / "summary.json").read_text())
    assert doc["transfer"]["lang"]["cells"] == json.loads(json.dumps(m.to_json()))["cells"]
    assert doc["meta"] == {"x": 1}
    # the build statistics of one call serve another (built once); other facts are refused
    again = transfer.transfer_matrix(tiny, facts, by="lang", stats=m.stats, **SMALL)
    assert again.cells == m.cells
    with pytest.raises(ValueError, match="other facts"):
        transfer.transfer_matrix(
            tiny,
            facts,
            by="lang",
            stats=m.stats,
            **{**SMALL, "matrix": replace(SMALL["matrix"], build_ids=4)},
        )


def test_a_build_step_that_sees_the_held_out_relation_is_refused(tiny, facts, monkeypatch):
    real = group_vectors.pooled_vectors

    def leaky(stats, **kw):  # ignores the selection: builds on every relation
        return real(stats, **{**kw, "relations": None})

    monkeypatch.setattr(group_vectors, "pooled_vectors", leaky)
    with pytest.raises(LeakError, match="all_but_capital"):
        transfer.transfer_matrix(
            tiny,
            facts,
            by="relation",
            **{**SMALL, "matrix": replace(SMALL["matrix"], held_out=("capital",))},
        )


def test_equal_rows_reuse_one_dev_choice_and_it_equals_searching_again(tiny, facts, monkeypatch):
    """With two relations ``all_but_capital`` is ``only_currency`` (same vectors, same dev
    facts) and the ``all`` row is the same in both matrices: each is searched once, and the
    reused choice equals the one a matrix without the equal row searches for itself."""
    two = [f for f in facts if f.relation in ("capital", "currency")]
    seen = _watch(monkeypatch)
    shared = transfer.MatrixShared()
    memo = shared.choices
    diag = {**SMALL, "matrix": replace(SMALL["matrix"], cells="diagonal")}
    rel = transfer.transfer_matrix(tiny, two, by="relation", stats=shared, **diag)
    assert rel.rows == ["all", "all_but_capital", "all_but_currency", "only_capital",
                        "only_currency"]  # fmt: skip
    assert len(seen["sweep"]) == 3 and len(memo) == 3  # all, {currency}, {capital}
    assert shared.stats is rel.stats  # built by the first matrix, for the second
    lang = transfer.transfer_matrix(tiny, two, by="lang", stats=shared, **diag)
    assert len(seen["sweep"]) == 5  # the lang matrix's all row came from the memo
    for a, b in (("all_but_capital", "only_currency"), ("all_but_currency", "only_capital")):
        ca, cb = rel.choices[a], rel.choices[b]
        assert {k: v for k, v in ca.items() if k != "relations"} == {
            k: v for k, v in cb.items() if k != "relations"}  # fmt: skip
    # searched again, without the equal rows: the same choices and the same cells
    alone = transfer.transfer_matrix(
        tiny, two, by="relation",
        **{**diag, "matrix": replace(diag["matrix"], held_out=("currency",))},
    )  # fmt: skip
    assert alone.rows == ["all", "all_but_currency", "only_currency"]
    for name in alone.rows:
        assert alone.choices[name] == rel.choices[name]
    assert [c for c in rel.cells if c["col"] == "currency"] == alone.cells
    fresh = transfer.transfer_matrix(tiny, two, by="lang", stats=rel.stats, **diag)
    assert fresh.choices == lang.choices and fresh.cells == lang.cells


def test_matrix_bad_arguments(tiny, facts):
    with pytest.raises(ValueError, match="by must be"):
        transfer.transfer_matrix(tiny, facts, by="script")
    with pytest.raises(ValueError, match="not among"):
        transfer.transfer_matrix(tiny, facts, matrix=MatrixSettings(held_out=("continent",)))
    with pytest.raises(ValueError, match="build fact ids per relation"):
        transfer.transfer_matrix(
            tiny, facts, matrix=MatrixSettings(build_ids=2), build=BuildSettings(k_shot=2)
        )
    with pytest.raises(ValueError, match="at least two relations"):
        transfer.transfer_matrix(tiny, [f for f in facts if f.relation == "capital"])


def test_cli_transfer_only_and_pooled_build(tiny_dir, tmp_path):
    from mechlingo.cli import main

    common = ["--model", str(tiny_dir), "--langs", "en,fr,de", "--limit", "16", "--quiet"]
    out = tmp_path / "t"
    rc = main(
        [
            "steer",
            "eval",
            *common,
            "--relation",
            "capital,currency",
            "--transfer-only",
            "--transfer",
            "lang",
            "--transfer-ids",
            "4,2,2,2",
            "--task-layers",
            "0",
            "--max-new-tokens",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert set(s["transfer"]) == {"lang", "notes"}
    assert {c["row"] for c in s["transfer"]["lang"]["cells"]} == {"all", "all_but_de", "all_but_fr"}
    assert "Transfer matrix by lang" in (out / "report.html").read_text()
    assert main(["steer", "eval", *common, "--out", str(tmp_path / "x")]) == 2  # no --vectors
    vdir = tmp_path / "v"
    pooled_args = ["--relation", "all", "--k-shot", "2", "--per-relation", "3"]
    assert main(["steer", "build", *common, *pooled_args, "--out", str(vdir)]) == 0
    build = json.loads((vdir / "build.json").read_text())
    assert set(build["relations"]) == set(RELATIONS) == set(build["ids_per_relation"])
    assert set(build["ids_per_relation"].values()) == {3}

"""``mechlingo replicate``: the verdict rules, the stage cache, every claim's row on the tiny
model, a failing stage, and a stopped run resumed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from statsmodels.stats.multitest import multipletests

from mechlingo.analyses.recall.transfer import MatrixShared
from mechlingo.card import replicate as rep
from mechlingo.card.rules import (
    CLAIMS,
    FLOOR,
    HOLDS,
    INCONCLUSIVE,
    NOT_HOLDS,
    NOT_TESTABLE,
    RULES_HASH,
    _side_ps,
)
from mechlingo.card.stages import transfer as transfer_stage
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.data import parallel_sentences
from tests.forks import torchrun

#: The repair stage of the test cards: a few dev and test ids, one layer and one scale.
_REPAIR = {"dev_per_lang": 4, "test_per_lang": 6, "layer_fractions": [0.5], "alphas": [0.28],
           "top_k": 1, "screen_ids": 2}  # fmt: skip

# Small enough for the tiny model (2 layers, d_mlp 128) to run every stage in seconds.
TINY = {
    "lu_langs": ["en", "fr", "es"],
    "trace": {"max_new_tokens": 3},
    "repair": {
        **_REPAIR,
        "seeds": [0, 1],
        "max_new_tokens": 3,
        "build_per_lang": None,  # every build id, as when the pinned rows were computed
    },
    "transfer": {
        "relations": ["capital", "currency", "language"],
        "limit": 20,
        "langs": ["en", "fr", "es"],
        "max_new_tokens": 3,
        "matrix": {
            "cells": "diagonal",
            "build_ids": 5,
            "dev_ids": 2,
            "test_ids": 3,
            "screen_ids": 1,
        },
    },
    "experts": {
        "n_find": 6,
        "n_heldout": 2,
        "ks": [3, 5],
        "samples": 3,
        "new_tokens": 3,
        "max_tokens": 8,
        "n_eval": 6,
        "eval_per_doc": 4,
        "n_boot": 20,
        "ppl_budget": 1000.0,
    },
}


def _parallel():
    return parallel_sentences(["en", "fr", "es"])


def _fake_transfer(fail: str | None = None):
    """A stand-in for ``mechlingo.analyses.recall.transfer`` (written in parallel): its interface,
    hand-made cells. ``fail``: the message of an error it raises instead."""
    calls = []

    class TM:
        def __init__(self, by):
            self.by = by
            self.stats = f"stats built by the {by} matrix"
            o = [0] * 10
            self.cells = [
                {
                    "row": f"all_but_{c}",
                    "col": c,
                    "n": 10,
                    "p": 0.01,
                    "gain": {"estimate": g / 10, "lo": 0.0, "hi": 0.5},
                    "control_gain": {"estimate": 0.0, "lo": -0.05, "hi": 0.05},
                    "control_p": 1.0,
                    "items": {
                        "ids": [f"{c}/{i}" for i in range(10)],
                        "orig": o,
                        "steered": [1] * g + [0] * (10 - g),
                        "control": o,
                    },
                }
                for c, g in (("a", 6), ("b", 5), ("c", 4))
            ] + [
                {
                    "row": "all",
                    "col": "a",
                    "n": 10,
                    "p": 0.01,
                    "gain": {"estimate": 0.8, "lo": 0.5, "hi": 1.0},
                    "control_gain": None,
                    "control_p": None,
                    "items": {
                        "ids": [f"a/{i}" for i in range(10)],
                        "orig": o,
                        "steered": [1] * 8 + [0] * 2,
                        "control": o,
                    },
                }
            ]

        def to_json(self):
            return {"by": self.by, "cells": self.cells}

    def transfer_matrix(model, facts, *, by="relation", seed=0, progress=False, **kw):
        shared = kw.get("stats")  # a MatrixShared: what the run's matrices share
        got = shared.stats if isinstance(shared, MatrixShared) else shared
        calls.append((by, len(facts), {**kw, "stats": got}))
        if fail:
            raise RuntimeError(fail)
        tm = TM(by)
        if isinstance(shared, MatrixShared) and shared.stats is None:
            shared.stats = tm.stats  # built by the first matrix, as the real one does
        return tm

    fake = types.SimpleNamespace(transfer_matrix=transfer_matrix, calls=calls)
    return fake


def _use(monkeypatch, fake):
    """The card's transfer stages call ``fake.transfer_matrix`` (set on the module they
    import, :mod:`mechlingo.analyses.recall.transfer`)."""
    monkeypatch.setattr(transfer_stage.transfer, "transfer_matrix", fake.transfer_matrix)
    return fake


# --------------------------------------------------------------------------------------
# The stage cache
# --------------------------------------------------------------------------------------


def test_stages_cache_key_and_errors(tmp_path):
    calls = []

    def work():
        calls.append(1)
        return {"x": [1.5, float("nan")], "n": 3}

    s = Checkpoints(tmp_path, {"model": "a", "settings": {"k": 1}})
    first = s.run("one", work)
    assert first == {"x": [1.5, None], "n": 3} and calls == [1]
    assert s.run("one", work) == first and calls == [1]  # read back, not recomputed
    assert Checkpoints(tmp_path, {"settings": {"k": 1}, "model": "a"}).run("one", work) == first
    assert calls == [1]  # the key's order does not matter
    Checkpoints(tmp_path, {"model": "b", "settings": {"k": 1}}).run("one", work)
    assert calls == [1, 1]  # another model: another key

    def broken():
        raise ValueError("no")

    with pytest.raises(ValueError):
        s.run("two", broken)
    assert not s.done("two") and not list(s.folder.glob(".two.*"))
    out = s.run("files", lambda tmp: (tmp / "a.txt").write_text("hi") and {"ok": True}, folder=True)
    assert out == {"ok": True} and (s.path("files") / "a.txt").read_text() == "hi"


def test_a_killed_stage_leaves_nothing_half_written(tmp_path):
    code = (
        "from mechlingo.core.checkpoints import Checkpoints\n"
        f"s = Checkpoints({str(tmp_path)!r}, {{'k': 1}})\n"
        "s.run('a', lambda: {'v': 1})\n"
        "s.run('b', lambda: {'v': 2})\n"
    )
    env = {**os.environ, "MECHLINGO_TEST_KILL_AT": "stage", "PYTHONPATH": os.getcwd()}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert p.returncode == -9  # SIGKILL inside the first stage, before its rename
    s = Checkpoints(tmp_path, {"k": 1})
    assert not s.done("a") and list(s.folder.glob(".a.building-*"))
    assert s.run("a", lambda: {"v": 1}) == {"v": 1}
    assert not list(s.folder.glob(".a.building-*"))  # the dead process's leftovers removed


# --------------------------------------------------------------------------------------
# The tiny model: every claim's row, a failing stage, a stopped run resumed
# --------------------------------------------------------------------------------------


def test_every_claim_row_and_a_failing_stage(tiny, tmp_path, monkeypatch):
    fake = _use(monkeypatch, _fake_transfer(fail="transfer exploded"))
    card = rep.replicate(
        tiny, rep.CardOptions(settings=TINY), rep.CardData(parallel=_parallel()), work=tmp_path
    )
    assert list(dict.fromkeys(r["id"] for r in card.rows)) == [c.id for c in CLAIMS]
    assert [r.get("variant") for r in card.rows if r["id"] == "lowest_language"] == [
        "literal rule, relative",
        "literal rule, points",
        "headroom rule, relative",
        "headroom rule, points",
    ]
    for r in card.rows:
        assert r["verdict"] in (HOLDS, NOT_HOLDS, INCONCLUSIVE, NOT_TESTABLE, FLOOR, "error")
        assert r["family"] in ("primary", "secondary")
        assert r["figure"].startswith("fig-") and r["paper_number"]
        if r["stage"].startswith("transfer"):
            assert r["verdict"] == "error" and "transfer exploded" in r["error"]
        else:
            assert r["verdict"] != "error", r
        if r["verdict"] in (HOLDS, NOT_HOLDS, INCONCLUSIVE):  # with its interval, n and p
            v = r["value"]["estimate"]
            assert v["n"] > 0 and v["lo"] <= v["estimate"] <= v["hi"]
            assert r["p"] is not None and r["p_adjusted"] >= r["p"]
        if r["verdict"] == NOT_TESTABLE:  # a true reason, never a NaN read as "no items"
            assert "no items" not in r["reason"] and "nan" not in r["reason"].lower()
        if r["verdict"] == HOLDS:
            assert r["p_adjusted"] < 0.05 and "adjusted p" in r["reason"]
    assert {c[0] for c in fake.calls} == {"relation", "lang"}
    assert card.meta["stages"]["transfer_lang"]["error"].endswith("transfer exploded")
    # the metric rule decided on dev, stored with its inputs; claims.json opens with it
    js = card.to_json()
    assert js["metric_decision"]["metric"] == card.meta["settings"]["metric"] == "rank"
    assert js["metric_decision"]["ruled"] == "rank" and "floor" in js["metric_rule"]
    assert [r["id"] for r in js["plan"]["rows"]][:2] == ["latent_english", "recall_failures"]
    # the repair stage's per-item outcomes, all in (lang, id) order, one per random draw
    rep_ = card.stages["repair"]
    seeds = TINY["repair"]["seeds"]
    assert sorted(c for c in rep_["outcomes"] if c.startswith("random_s")) == [
        f"random_s{s}" for s in seeds]  # fmt: skip
    assert rep_["p_floor"] == pytest.approx(1 / (len(seeds) + 1))
    # one population per condition (random task, random diff, random both), the one matched
    # to the selected condition scored once (random_s)
    pops = rep_["populations"]
    assert set(pops) == {"task", "diff", "both"} and "random_s" in pops.values()
    for prefix in pops.values():
        got = [c for c in rep_["outcomes"] if c.startswith(prefix) and c[len(prefix) :].isdigit()]
        assert sorted(got) == [f"{prefix}{s}" for s in seeds]
    for key in ("share", "lenient"):
        assert {lg: len(v) for lg, v in rep_[key]["orig"].items()} == {
            lg: len(v) for lg, v in rep_["ids"].items()}  # fmt: skip
    assert all(0 < x < 1 for v in rep_["share"]["task"].values() for x in v)
    assert all("first_mismatch_en_layer" in r for r in card.stages["trace"]["records"])
    # the random-neuron population: per sentence in align, medians in the AUROC
    al, au = card.stages["align"], card.stages["experts"]["auroc"]
    draws = rep.budget_settings("quick", TINY)["experts"]["random_sets"]
    assert al["random_draws"] == draws == len(au["random_population"])
    assert al["per_sentence"]["random_s0"] == al["per_sentence"]["control"]
    n = len(al["per_sentence"]["pre"]["retrieval"])
    assert (
        len(al["docs"]) == n and len(al["per_sentence"][f"random_s{draws - 1}"]["retrieval"]) == n
    )
    assert au["n_clusters"] == len(set(au["docs"])) and len(au["docs"]) == au["n_sentences"]
    df = card.to_dataframe()
    assert list(df["id"]) == [r["id"] for r in card.rows] and "p_adjusted" in df
    assert "<table" in card._repr_html_() and "claims card" in card.to_markdown().lower()
    # the stage that failed is tried again next time; the others are read back
    fake = _use(monkeypatch, _fake_transfer())
    again = rep.replicate(
        tiny, rep.CardOptions(settings=TINY), rep.CardData(parallel=_parallel()), work=tmp_path
    )
    cached = {n: t["cached"] for n, t in again.meta["stages"].items()}
    assert cached == {
        "metric": True,
        "trace": True,
        "repair": True,
        "transfer_relation": False,
        "transfer_lang": False,
        "decoders": True,
        "conversion": True,
        "external": True,
        "circuits": True,
        "experts": True,
        "align": True,
    }
    rows = {(r["id"], r.get("variant")): r for r in again.rows}
    gain = rows[("independent_relations", "held-out gain")]
    assert gain["value"]["estimate"]["estimate"] == pytest.approx(15 / 30)  # 6+5+4 of 30
    # one random vector per cell: a population of one draw, whose rank p (0.5) never decides
    assert gain["value"]["n_clusters"] == 30 and gain["verdict"] == INCONCLUSIVE
    share = rows[("independent_relations", "retained share")]
    assert share["value"]["estimate"]["estimate"] == pytest.approx(6 / 8)  # only a has an all cell
    assert again.meta["rules_hash"] == RULES_HASH and again.meta["budgets_hash"]
    # the language matrix reuses the relation matrix's build statistics within a run
    stats_kw = {c[0]: c[2].get("stats") for c in fake.calls}
    assert stats_kw == {"relation": None, "lang": "stats built by the relation matrix"}
    # the other rows' tests are read back unchanged; their adjusted p (and so possibly a
    # verdict) moves, since the secondary family now has the transfer rows too
    keep = ("value", "control", "vs_control", "p", "details")
    same = [{k: r[k] for k in keep} for r in again.rows if not r["stage"].startswith("transfer")]
    assert same == [
        {k: r[k] for k in keep} for r in card.rows if not r["stage"].startswith("transfer")
    ]

    # the independence rows join Lu's primary Holm family: on each side, every primary row's
    # adjusted p is then statsmodels' Holm over the family's p-values of that side
    for paper in {r["paper"] for r in again.rows}:
        fam = [r for r in again.rows if r["family"] == "primary" and r["paper"] == paper
               and _side_ps(r)[0] is not None]  # fmt: skip
        if not fam:
            continue
        for side, key in ((0, "p_decision"), (1, "p_against_decision")):
            _, adj, _, _ = multipletests([_side_ps(r)[side] for r in fam], 0.05, "holm")
            assert [r["adjustment"][key] for r in fam] == pytest.approx(list(adj))


# --------------------------------------------------------------------------------------
# The card built by stage gives the rows computed before the split (pinned)
# --------------------------------------------------------------------------------------

PINNED = Path(__file__).parents[1] / "fixtures" / "card"
#: The claims' static texts (from ``CLAIMS``), the texts formatted from the values, and a
#: primary row's ``plan`` (Monte Carlo rates on the dev split's numbers: a shift of 1e-4 in a
#: float32 score can move one simulated row; tests/card/test_power.py checks the planner).
_STATIC = {"claim", "measure", "paper_number", "rule", "paper", "figure", "stage", "p_rule",
           "control_text", "value_text", "vs_control_text", "plan"}  # fmt: skip


def _mismatches(got, want, path="rows", rel=1e-3):
    """Where ``got`` differs from ``want`` (floats to ``rel`` relative, NaN equal to NaN).
    float32 scores move by up to ~1e-4 relative between transformers releases (seen from 5.2x
    to 5.25); a change in what a row computes moves them far more."""
    if isinstance(want, float) or isinstance(got, float):
        ok = isinstance(got, (int, float)) and isinstance(want, (int, float)) and (
            math.isclose(got, want, rel_tol=rel, abs_tol=1e-6)
            or (math.isnan(got) and math.isnan(want)))  # fmt: skip
        return [] if ok else [f"{path}: {got!r} != {want!r}"]
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(set(got) ^ set(want))}"]
        return [m for k in want for m in _mismatches(got[k], want[k], f"{path}.{k}", rel)]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items != {len(want)}"]
        return [
            m
            for i, (a, b) in enumerate(zip(got, want, strict=True))
            for m in _mismatches(a, b, f"{path}[{i}]", rel)
        ]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def _check_pinned(card, work, name):
    """The card's rows equal the pinned ones, and its stages sit in the pinned checkpoint folder
    (the same key: a user's checkpoints are reused)."""
    pinned = json.loads((PINNED / name).read_text())
    rows = [{k: v for k, v in r.items() if k not in _STATIC} for r in card.to_json()["claims"]]
    if os.environ.get("MECHLINGO_REPIN") == "1":  # after a logged rule change: rewrite the pins
        pinned["claims"] = rows
        (PINNED / name).write_text(json.dumps(pinned, indent=1) + "\n")
    bad = _mismatches(rows, pinned["claims"])
    assert not bad, bad[:10]
    assert sorted(p.name for p in Path(work).iterdir()) == [pinned["stage_folder"]]


def test_a_stopped_run_resumes_to_the_same_card(tiny, tmp_path, monkeypatch):
    _use(monkeypatch, _fake_transfer())
    full = rep.replicate(
        tiny,
        rep.CardOptions(settings=TINY),
        rep.CardData(parallel=_parallel()),
        work=tmp_path / "a",
    )
    _check_pinned(full, tmp_path / "a", "tiny_rows.json")  # the rows before the stage split
    real = transfer_stage.stage_transfer

    def stop(*a, **kw):  # Ctrl-C in the third stage
        raise KeyboardInterrupt

    monkeypatch.setattr(transfer_stage, "stage_transfer", stop)
    with pytest.raises(KeyboardInterrupt):
        rep.replicate(
            tiny,
            rep.CardOptions(settings=TINY),
            rep.CardData(parallel=_parallel()),
            work=tmp_path / "b",
        )
    monkeypatch.setattr(transfer_stage, "stage_transfer", real)
    resumed = rep.replicate(
        tiny,
        rep.CardOptions(settings=TINY),
        rep.CardData(parallel=_parallel()),
        work=tmp_path / "b",
    )
    cached = {n: t["cached"] for n, t in resumed.meta["stages"].items()}
    assert cached["trace"] and cached["repair"] and not cached["transfer_relation"]
    assert resumed.rows == full.rows
    assert json.dumps(resumed.stages, sort_keys=True) == json.dumps(full.stages, sort_keys=True)


def test_cli_writes_the_card(tiny_dir, tmp_path, monkeypatch):
    from mechlingo.cli import main

    _use(monkeypatch, _fake_transfer())
    data = tmp_path / "par"
    data.mkdir()
    for lg, lines in _parallel().items():
        (data / f"{lg}.txt").write_text("\n".join(lines[:20]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    args = [
        "replicate",
        "--model",
        str(tiny_dir),
        "--paper",
        "sundar2025",
        "--parallel",
        str(data),
        "--settings",
        json.dumps(TINY),
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(args) == 0
    card = json.loads((out / "claims.json").read_text())
    ids = [c.id for c in CLAIMS if c.paper == "sundar2025"]
    assert list(dict.fromkeys(r["id"] for r in card["claims"])) == ids
    assert card["rules"]["holds"].startswith("adjusted p < 0.05") and "families" in card["rules"]
    assert card["rules_hash"] == RULES_HASH and card["meta"]["budgets_hash"] == rep.BUDGETS_HASH
    page = (out / "report.html").read_text()
    assert page.index("<table class='claims'>") < page.index("id='fig-experts'")
    for r in card["claims"]:
        assert f"href='#{r['figure']}'" in page and f"id='{r['figure']}'" in page
    assert "| p (adjusted) |" in (out / "claims.md").read_text()
    # the stages were kept in .out.work until out was written, then removed (the rule of
    # every long command; a stopped run resumes: tests/cli/test_work.py::test_kill_replicate)
    assert not (tmp_path / ".out.work").exists() and not (out / "stages").exists()
    bad = [
        "replicate",
        "--model",
        str(tiny_dir),
        "--facts",
        str(tmp_path / "none.jsonl"),
        "--out",
        str(tmp_path / "bad"),
        "--quiet",
    ]
    assert main(bad) == 2 and not (tmp_path / "bad").exists()


def test_a_card_on_a_benchmark_folder(tiny_dir, tmp_path, monkeypatch):
    """``--facts`` a BMLAMA folder: the Lu families run on the benchmark's facts under its own
    metric (rank: the gold share judged), each vector against its own condition's random
    population."""
    from mechlingo.cli import main

    _use(monkeypatch, _fake_transfer())
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    out = tmp_path / "out"
    args = ["replicate", "--model", str(tiny_dir), "--paper", "lu2025", "--facts",
            str(fixtures / "bmlama_card"), "--settings", json.dumps(TINY), "--out", str(out),
            "--quiet"]  # fmt: skip
    assert main(args) == 0
    card = json.loads((out / "claims.json").read_text(encoding="utf-8"))
    assert card["meta"]["metric"] == "rank" and "benchmark" in card["meta"]["facts_metric"]
    rows = {(r["id"], r.get("variant")): r for r in card["claims"]}
    assert {c.id for c in CLAIMS if c.paper == "lu2025"} == {i for i, _ in rows}
    task, diff = rows[("task_vector", None)], rows[("diff_vector", None)]
    assert task["outcome"] == diff["outcome"] == "gold share"
    assert "random_task_s0" in task["details"] + diff["details"] or (
        "random_diff_s0" in task["details"] + diff["details"])  # fmt: skip
    assert task["verdict"] != "error"
    # the benchmark's ids, not the bundled ones: 20 countries in 2 relations, 3 languages
    assert "x_is_located_in_y" in json.dumps(card["meta"]["facts_scope"]["relations"])
    # the external rows need --external (tests/card/stages/test_data.py)
    assert "--external" in rows[("external_task", None)]["reason"]


def test_a_card_on_a_klar_folder(tiny_dir, tmp_path, monkeypatch):
    """``--facts`` a KLAR folder: the Lu families run on the benchmark's facts under KLAR's
    own metric (``klar``: 0/1 correctness, the benchmark's matching rule)."""
    from mechlingo.card.stages.base import Context
    from mechlingo.cli import main

    _use(monkeypatch, _fake_transfer())
    read: dict[str, set[str]] = {}
    lu_facts = Context.lu_facts

    def spy(self, section):  # the facts each Lu stage reads
        got = lu_facts(self, section)
        read.setdefault(section, set()).update(f.id for f in got)
        return got

    monkeypatch.setattr(Context, "lu_facts", spy)
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    out = tmp_path / "out"
    args = ["replicate", "--model", str(tiny_dir), "--paper", "lu2025", "--facts",
            str(fixtures / "klar_card"), "--settings", json.dumps(TINY), "--out", str(out),
            "--quiet"]  # fmt: skip
    assert main(args) == 0
    card = json.loads((out / "claims.json").read_text(encoding="utf-8"))
    meta = card["meta"]
    assert meta["metric"] == "klar" and "klar" in meta["facts_metric"]
    assert meta["settings"]["metric"] == "klar" and meta["metric_decision"]["given"] == "klar"
    rows = {(r["id"], r.get("variant")): r for r in card["claims"]}
    assert {c.id for c in CLAIMS if c.paper == "lu2025"} == {i for i, _ in rows}
    task = rows[("task_vector", None)]
    assert task["outcome"] == "accuracy" and task["verdict"] != "error"
    # the benchmark's facts: its two relations (the file names), its ids (the samples'
    # indices, 20 countries), its three languages
    assert meta["facts_scope"]["relations"] == ["capital", "language"]
    assert sorted(meta["facts_scope"]["lu_langs"]) == ["en", "es", "fr"]
    klar_ids = {f"{r}/{i}" for r in ("capital", "language") for i in range(20)}
    assert {"repair", "trace"} <= set(read)
    assert all(ids and ids <= klar_ids for ids in read.values()), read


def test_facts_folder(tmp_path):
    from mechlingo.cli.replicate import read_facts_arg
    from mechlingo.data import load_facts, write_jsonl

    a = load_facts(langs=["en"], relations=["capital"], limit=3)
    b = load_facts(langs=["fr"], relations=["capital"], limit=2)
    write_jsonl(a, tmp_path / "a.jsonl")
    write_jsonl(b, tmp_path / "b.jsonl")
    (tmp_path / "notes.txt").write_text("not facts")
    got = read_facts_arg(str(tmp_path))
    assert [(f.id, f.lang) for f in got] == [(f.id, f.lang) for f in a + b]
    assert [f.id for f in read_facts_arg(str(tmp_path / "b.jsonl"))] == [f.id for f in b]


#: A smaller configuration than ``--budget quick`` for the embedded model's card test.
SMALL = {
    "lu_langs": ["en", "fr"],
    "repair": {
        **_REPAIR,
        "seeds": [0],
        "build_per_lang": 8,  # the vectors on 8 build ids per language (rows pinned so)
    },
    # 2 facts per relation have 2 distinct objects: 2 candidates under the rank metric
    "candidates": 2,
    "transfer": {
        "relations": ["capital", "currency", "language"],
        "limit": 2,
        "langs": ["en", "fr"],
    },
    "experts": {
        "n_find": 8,
        "n_heldout": 2,
        "ks": [50],
        "samples": 4,
        "new_tokens": 6,
        "max_tokens": 12,
        "n_eval": 6,
        "eval_per_doc": 4,
        "n_boot": 50,
    },
    # the same-mechanism rows on fr only, from few facts (the quick budget's fr and es cost a
    # CPU-minute)
    "circuits": {"langs": ["fr"], "dev_per_lang": 4, "test_per_lang": 6, "steps": 1, "draws": 99},
}


@pytest.mark.slow
def test_embedded_model_small_configuration(gemma, tmp_path, monkeypatch):
    """A smaller configuration than --budget quick on the embedded model (the quick and full
    budgets are `make replicate`): every row is produced, with intervals."""
    _use(monkeypatch, _fake_transfer())
    par = parallel_sentences(["en", "fr", "es", "de"])
    card = rep.replicate(
        gemma, rep.CardOptions(settings=SMALL), rep.CardData(parallel=par), work=tmp_path
    )
    assert list(dict.fromkeys(r["id"] for r in card.rows)) == [c.id for c in CLAIMS]
    errors = [(r["id"], r.get("error")) for r in card.rows if r["verdict"] == "error"]
    assert not errors, errors
    rows = {r["id"]: r for r in card.rows}
    assert rows["experts_exist"]["value"]["estimate"]["n"] == 24  # 6 held-out lines x 4 languages
    assert rows["experts_exist"]["value"]["n_clusters"] == 6  # a sentence and its translations
    # real experts, even from 8 sentences: above all 5 random neuron sets, but their rank p
    # (1/6) cannot decide a row with 5 draws (one definition of beating a control)
    assert rows["experts_exist"]["vs_control"]["p"] == pytest.approx(1 / 6)
    assert rows["experts_exist"]["verdict"] == INCONCLUSIVE
    _check_pinned(card, tmp_path, "small_embedded_rows.json")  # the rows before the stage split


def test_weights_fingerprint_sees_a_block_change(tiny):
    import torch

    before = rep.weights_fingerprint(tiny)
    assert rep.weights_fingerprint(tiny) == before
    name, p = next((n, q) for n, q in tiny.named_parameters() if "blocks.1" in n or "layers.1" in n)
    with torch.no_grad():
        old = p.view(-1)[0].clone()
        p.view(-1)[0] += 1.0
        try:
            assert rep.weights_fingerprint(tiny) != before, name  # the unembedding is the same
        finally:
            p.view(-1)[0] = old
    assert rep.weights_fingerprint(tiny) == before


@pytest.mark.skipif(sys.platform == "win32", reason="torchrun with gloo on CPU")
def test_the_card_under_torchrun_writes_the_same_claims(tiny_dir, tmp_path):
    """`torchrun --nproc_per_node 2 -m mechlingo.cli replicate ...` (gloo, CPU; each rank
    scores its share of every batch; the launcher and its ranks forked from this process,
    :func:`tests.forks.torchrun`) writes the claims.json of one process (the measured
    seconds aside). Skipped when torchrun cannot start."""
    import torch

    if not torch.distributed.is_available():
        pytest.skip("no torch.distributed")
    data = tmp_path / "par"
    data.mkdir()
    for lg, lines in _parallel().items():
        (data / f"{lg}.txt").write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    from mechlingo.cli import main

    args = ["-m", "mechlingo.cli", "replicate", "--model", str(tiny_dir), "--parallel", str(data),
            "--settings", json.dumps(TINY), "--quiet"]  # fmt: skip
    # the one-process card in this process (one thread, as each torchrun worker): the same
    # command without a second interpreter's start
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*args[2:], "--out", str(tmp_path / "one")]) == 0
    finally:
        torch.set_num_threads(threads)
    two = torchrun([*args, "--out", str(tmp_path / "two")], tmp_path / "torchrun.log")
    if two.returncode != 0 and "rendezvous" in two.stdout.lower():
        pytest.skip("torchrun could not start: " + two.stdout[-300:])
    assert two.returncode == 0, two.stdout[-3000:]

    def card(folder):
        js = json.loads((folder / "claims.json").read_text())
        js.pop("plan")  # measured seconds per item
        for k in ("stages", "work", "plan"):
            js["meta"].pop(k, None)
        return js

    one_card, two_card = card(tmp_path / "one"), card(tmp_path / "two")
    assert one_card["claims"] and len(one_card["claims"]) == len(two_card["claims"])
    # the verdicts, n and every text exactly; the continuous numbers to 1e-3 relative (a rank
    # scores batches of other sizes: the log-probabilities move in the 5th digit, measured)
    key = ("id", "variant", "verdict", "family", "reason")
    assert [[r.get(k) for k in key] for r in two_card["claims"]] == [
        [r.get(k) for k in key] for r in one_card["claims"]]  # fmt: skip
    bad = _mismatches(two_card, one_card, "claims.json", rel=1e-3)
    assert not bad, bad[:10]

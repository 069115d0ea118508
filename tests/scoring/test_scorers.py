"""The scorers behind ``--metric``: candidate ranking (BMLAMA), KLAR's prefix rule, RankC, CLC.

Every fixture here is written by this file (facts built in code, JSONL files written to a
temporary folder in mechlingo's own schema with the cloze fields ``suffix`` and
``candidates``); no benchmark data is copied.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from mechlingo.analyses.recall import dev_grid
from mechlingo.core.errors import InputError
from mechlingo.core.sites import resolve_site
from mechlingo.data import Fact, load_facts
from mechlingo.data.splits import split_facts
from mechlingo.interventions import Ablation, Compose, NeuronClamp, SteeringVector
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_facts
from mechlingo.scoring.rank import batch_order, candidate_layout, score_candidates
from mechlingo.scoring.scorers import (
    KLAR_MAX_NEW_TOKENS,
    SKIP_GOLD_MISSING,
    SKIP_NO_CANDIDATES,
    SKIP_NO_STEM,
    Scorer,
    clc,
    generate_record,
    generation_rule,
    klar_decided,
    klar_match,
    klar_prompt,
    klar_record,
    rankc,
    rankc_fact,
)
from tests.conftest import count_hooks


def _fact(i, lang, prompt, answer, cands, suffix="", rel="capital", answer_en="", subject=None):
    """A cloze fact; the subject is the prompt's first word (or ``subject``, which may sit in
    the suffix when the mask opens the sentence)."""
    subject = subject or prompt.split()[0]
    start = prompt.find(subject)
    span = (start, start + len(subject)) if start >= 0 else (0, 0)
    return Fact(
        f"{rel}/{i}", rel, lang, subject, prompt, answer, answer_en=answer_en,
        subject_span=span, suffix=suffix, candidates=tuple(cands),
    )  # fmt: skip


FACTS = [
    _fact(1, "en", "The capital of France is", "Paris", ["Paris", "Rome"], suffix=", a city."),
    _fact(2, "en", "Berlin is a city in", "Germany", ["Spain", "Germany", "Chile"], suffix="."),
    _fact(
        3,
        "fr",
        "La capitale de l'Italie est",
        "Rome",
        ["Rome", "Madrid", "Oslo", "Lima"],
        answer_en="Rome",
    ),
    _fact(
        4,
        "ja",
        "",
        "東京",
        ["東京", "大阪"],
        suffix="は日本の首都です。",
        subject="日本",
        answer_en="Tokyo",
    ),
    _fact(
        5,
        "de",
        "Die Hauptstadt",
        "Wien",
        ["Bern", "Wien"],
        suffix=" liegt in Österreich.",
        answer_en="Vienna",
    ),
]


def _hand_logprobs(model, text, hooks=()):
    """Per-position log-probabilities of ``text``'s tokens (from position 1) from one plain
    forward pass over the full vocabulary: ``log_softmax`` by hand."""
    ids = model.to_tokens(text, prepend_bos=True, truncate=False)
    logits = model.run_with_hooks(ids, fwd_hooks=list(hooks)) if hooks else model(ids)
    lp = torch.log_softmax(logits[0, :-1].double(), dim=-1)
    return lp.gather(1, ids[0, 1:, None])[:, 0], ids[0]


# --------------------------------------------------------------------------------------
# Rank: parity with a hand computation, batching, few-shot, interventions
# --------------------------------------------------------------------------------------


def test_two_candidate_ranking_matches_hand_cross_entropy(tiny):
    f = FACTS[0]
    scores = score_candidates(tiny, [f])
    sc_cand = score_candidates(tiny, [f], tokens="candidate")
    hand, hand_cand = [], []
    for c in f.candidates:
        lp, ids = _hand_logprobs(tiny, f.filled(c))
        hand.append(float(-lp.mean()))
        n_stem = tiny.to_tokens(f.prompt, prepend_bos=True).shape[1]
        n_upto = tiny.to_tokens(f"{f.prompt} {c}", prepend_bos=True).shape[1]
        assert ids[:n_stem].tolist() == tiny.to_tokens(f.prompt)[0].tolist()
        hand_cand.append(float(-lp[n_stem - 1 : n_upto - 1].mean()))
    np.testing.assert_allclose(scores.ce[0], hand, atol=1e-4)
    np.testing.assert_allclose(sc_cand.ce[0], hand_cand, atol=1e-4)
    res = evaluate_facts(tiny, [f], metric="rank")
    rec = res.records[0]
    best = int(np.argmin(hand))
    assert rec["ranking"][0] == best and rec["correct"] == (best == 0)
    assert rec["gold_rank"] == (1 if best == 0 else 2)
    assert rec["generation"] == f.candidates[best]


@pytest.mark.parametrize("positions", [None, "last", "all", -2])
def test_batched_ranking_equals_one_sentence_at_a_time(tiny, positions):
    pre = ["Q: a\nA: b\n", "", "x y z\n", "", "Hallo.\n"]
    iv = None
    if positions is not None:  # the stem read once per fact must not change any score
        v = torch.randn(int(tiny.cfg.d_model), generator=torch.Generator().manual_seed(1))
        iv = SteeringVector(v, 1, 3.0, positions=positions)
    keep = [i for i, f in enumerate(FACTS) if f.prompt or positions != -2]  # -2 needs 2 tokens
    facts, pre = [FACTS[i] for i in keep], [pre[i] for i in keep]
    for tokens in ("sentence", "candidate"):
        for prefixes in (None, pre):
            batched = score_candidates(
                tiny, facts, tokens=tokens, prefixes=prefixes, batch_size=4, intervention=iv
            )  # two passes, mixed lengths, padding
            for i, f in enumerate(facts):
                for j, c in enumerate(f.candidates):
                    alone = score_candidates(
                        tiny, [f], candidates=[[c]], tokens=tokens, intervention=iv,
                        prefixes=None if prefixes is None else [prefixes[i]],
                    )  # fmt: skip
                    assert batched.ce[i][j] == pytest.approx(alone.ce[0][0], abs=1e-4)
                    assert batched.n_tokens[i][j] == alone.n_tokens[0][0]


def test_few_shot_rank_scores_only_the_query_sentence(tiny):
    f, prefix = FACTS[1], "Paris is a city in France.\nRome is a city in Italy.\n"
    sc = score_candidates(tiny, [f], prefixes=[prefix])
    n_prefix = tiny.to_tokens(prefix, prepend_bos=True).shape[1]
    for j, c in enumerate(f.candidates):
        lp, ids = _hand_logprobs(tiny, prefix + f.filled(c))
        assert ids[:n_prefix].tolist() == tiny.to_tokens(prefix)[0].tolist()
        query = lp[n_prefix - 1 :]
        assert sc.n_tokens[0][j] == len(query) == len(ids) - n_prefix
        assert sc.ce[0][j] == pytest.approx(float(-query.mean()), abs=1e-4)


def test_last_token_steering_under_rank_acts_before_the_mask(tiny):
    f = FACTS[1]
    v = torch.randn(int(tiny.cfg.d_model), generator=torch.Generator().manual_seed(3))
    iv = SteeringVector(v, 1, 4.0, positions="last")
    steered = score_candidates(tiny, [f], intervention=iv)
    name = resolve_site(tiny, "resid_pre", 1).hook_name
    stem = tiny.to_tokens(f.prompt, prepend_bos=True).shape[1]
    for j, c in enumerate(f.candidates):
        lay = candidate_layout(tiny, f, c)
        assert lay.stem_end == stem  # the token before the mask is the prompt's last

        def add_at(pos):
            def hook(t, hook):
                t = t.clone()
                t[:, pos] += 4.0 * v.to(t.dtype)
                return t

            return hook

        lp, ids = _hand_logprobs(tiny, f.filled(c), [(name, add_at(stem - 1))])
        assert steered.ce[0][j] == pytest.approx(float(-lp.mean()), abs=1e-4)
        wrong, _ = _hand_logprobs(tiny, f.filled(c), [(name, add_at(len(ids) - 1))])
        assert abs(float(-wrong.mean()) - steered.ce[0][j]) > 1e-3
    assert count_hooks(tiny) == 0


def test_batch_order_groups_facts_by_prefix_then_longest_row(tiny):
    facts = [FACTS[0], FACTS[1], FACTS[0], FACTS[1]]
    pre = ["B. ", "A. ", "A. ", "B. "]
    layouts = [[candidate_layout(tiny, f, c, p) for c in f.candidates]
               for f, p in zip(facts, pre, strict=True)]  # fmt: skip
    order = batch_order(pre, layouts)
    longest = [max(len(x.ids) for x in layouts[i]) for i in order]
    assert sorted(order) == [0, 1, 2, 3]
    assert [pre[i] for i in order] == ["A. ", "A. ", "B. ", "B. "]  # one prefix per run
    assert longest[:2] == sorted(longest[:2]) and longest[2:] == sorted(longest[2:])
    same = [[candidate_layout(tiny, FACTS[0], c) for c in FACTS[0].candidates]] * 3
    assert batch_order([""] * 3, same) == [0, 1, 2]  # ties keep the given order


@pytest.mark.parametrize("metric", ["generate", "klar", "rank"])
def test_every_intervention_kind_applies_under_every_metric(tiny, metric):
    facts = [FACTS[0], FACTS[1], FACTS[4]]
    d, d_mlp = int(tiny.cfg.d_model), int(tiny.cfg.d_mlp)
    kinds = {
        "steer": SteeringVector(torch.ones(d) * 3, 0, 1.0, positions="all"),
        "clamp": NeuronClamp({0: list(range(d_mlp))}, 5.0),
        "ablation": Ablation("resid_pre", 1, "zero"),
    }
    kinds["compose"] = Compose([kinds["steer"], kinds["clamp"]])
    kw = {"metric": metric, "decoding": DecodeOptions(max_new_tokens=3, early_stop=False)}
    base = evaluate_facts(tiny, facts, **kw)
    key = "scores" if metric == "rank" else "generation"
    n_changed = 0
    for name, iv in kinds.items():
        calls: list[str] = []
        real = iv.fwd_hooks

        def spied(model, real=real, calls=calls):
            def wrap(n, fn):
                return lambda t, hook: (calls.append(n), fn(t, hook))[1]

            return [(n, wrap(n, fn)) for n, fn in real(model)]

        iv.fwd_hooks = spied
        res = evaluate_facts(tiny, facts, intervention=iv, **kw)
        assert calls, f"{name} never ran under {metric}"
        assert count_hooks(tiny) == 0
        n_changed += any(a[key] != b[key] for a, b in zip(base.records, res.records, strict=True))
    assert n_changed >= (4 if metric == "rank" else 1)


def test_protocol_score_takes_the_metric(tiny):
    res = dev_grid.score(tiny, FACTS, None, metric="rank", decoding=DecodeOptions(batch_size=2))
    assert res.meta["metric"]["metric"] == "rank" and len(res.records) == len(FACTS)
    res = dev_grid.score(tiny, FACTS, None, metric=Scorer("rank", rank_tokens="candidate"))
    assert res.meta["metric"] == {"metric": "rank", "rank_tokens": "candidate"}


# --------------------------------------------------------------------------------------
# Skips
# --------------------------------------------------------------------------------------


def test_records_a_metric_cannot_use_are_counted_not_dropped(tiny):
    no_cands = Fact("capital/9", "capital", "en", "X", "The capital of Peru is", "Lima")
    no_gold = _fact(8, "en", "The capital of Chile is", "Santiago", ["Lima", "Quito"])
    facts = [*FACTS, no_cands, no_gold]
    rank = evaluate_facts(tiny, facts, metric="rank")
    assert rank.skipped == {SKIP_NO_CANDIDATES: 1, SKIP_GOLD_MISSING: 1}
    assert len(rank.records) == len(FACTS)
    gen = evaluate_facts(tiny, facts, metric="generate", decoding=DecodeOptions(max_new_tokens=2))
    assert gen.skipped == {SKIP_NO_STEM: 1} and len(gen.records) == len(facts) - 1
    with pytest.raises(InputError, match="can score none"):
        evaluate_facts(tiny, [no_cands], metric="rank")
    with pytest.raises(InputError, match="can score none"):
        evaluate_facts(tiny, [FACTS[3]], metric="klar")


# --------------------------------------------------------------------------------------
# KLAR
# --------------------------------------------------------------------------------------

KLAR_CASES = [
    ("Paris", "Paris", True),
    ("paris", "PARIS", True),
    (" Paris\nWhat is the capital", "Paris", True),  # the target is a prefix of it
    ("Par", "Paris", True),  # a non-empty prefix of the target
    ("P", "Paris", True),
    ("Parisian", "Paris", True),  # no word boundary in the reference rule
    ("Romania", "Rome", False),
    ("Rome", "Romania", False),
    ("", "Paris", False),  # an empty prediction never counts
    ("   ", "Paris", False),
    ("Paris", "", False),
    ("東京です", "東京", True),
    ("Madrid", "Paris", False),
]


@pytest.mark.parametrize(("pred", "target", "ok"), KLAR_CASES)
def test_klar_prefix_rule(pred, target, ok):
    assert klar_match(pred, target) is ok


@pytest.mark.parametrize(("pred", "target", "ok"), KLAR_CASES)
def test_klar_decided_prefixes_agree_with_the_full_verdict(pred, target, ok):
    for k in range(len(pred) + 1):
        part = pred[:k]
        if klar_decided(part, [target]):
            later = [klar_match(pred[:m], target) for m in range(k, len(pred) + 1)]
            assert all(x == klar_match(part, target) for x in later), (part, target)


def test_klar_prompt_is_three_solved_demonstrations_then_the_query():
    pool = [_fact(i, "en", f"Country {i} has capital", f"C{i}", []) for i in range(6)]
    other = [_fact(10, "fr", "Pays 10 capitale", "X", []), _fact(11, "en", "Q", "Y", [], rel="r")]
    q = pool[0]
    text = klar_prompt(q, pool + other, 3)
    lines = text.split("\n")
    assert len(lines) == 4 and lines[-1] == q.prompt
    for line in lines[:3]:
        i = int(line.split()[1])
        assert i != 0 and line == f"Country {i} has capital C{i}"
    assert klar_prompt(q, pool[:2], 3) == f"{pool[1].prompt} C1\n{q.prompt}"  # fewer, as ref
    assert klar_prompt(q, pool + other, 3) == text  # seeded by the query id


def test_generation_rule_holds_each_metrics_prompts_length_and_stop():
    pool = [_fact(i, "en", f"Country {i} has capital", f"C{i}", []) for i in range(4)]
    texts = [f"few-shot {f.prompt}" for f in pool[:2]]
    gen = generation_rule(Scorer("generate"), pool[:2], texts, pool, max_new_tokens=5,
                          early_stop=True)  # fmt: skip
    assert (gen.texts, gen.max_new_tokens, gen.stop_at_newline) == (texts, 5, True)
    assert gen.record is generate_record and gen.stop is not None
    assert gen.stop(0, " C0 is") and not gen.stop(1, " C")  # decided: right / still open
    klar = generation_rule(Scorer("klar", klar_shots=2), pool[:2], texts, pool,
                           max_new_tokens=5, early_stop=False)  # fmt: skip
    assert klar.texts == [klar_prompt(f, pool, 2) for f in pool[:2]]
    assert (klar.max_new_tokens, klar.stop_at_newline, klar.stop) == (KLAR_MAX_NEW_TOKENS, False,
                                                                      None)  # fmt: skip
    assert klar.record is klar_record
    with pytest.raises(InputError, match="not a generation metric"):
        generation_rule(Scorer("rank"), pool, texts, pool, max_new_tokens=5, early_stop=True)


def test_clc_is_the_jaccard_overlap_with_english():
    recs = [{"id": i, "lang": "en", "correct": i in "abc"} for i in "abcde"]
    recs += [{"id": i, "lang": "fr", "correct": i in "bcd"} for i in "abcde"]
    recs += [{"id": i, "lang": "de", "correct": False} for i in "abcdf"]
    out = clc(recs)
    assert out["fr"]["estimate"] == pytest.approx(2 / 4) and out["fr"]["n"] == 5
    assert out["fr"]["lo"] <= 0.5 <= out["fr"]["hi"]
    assert out["en"]["estimate"] == 1.0
    assert out["de"]["estimate"] == 0.0 and out["de"]["n"] == 4  # ids scored in both only


# --------------------------------------------------------------------------------------
# RankC
# --------------------------------------------------------------------------------------


def test_rankc_on_a_small_table_matches_the_papers_formula():
    # Qi et al. 2023: RankC = mean over facts of sum_j w_j P@j, w_j = e^(N-j+1) / sum_k e^k,
    # P@j = |top-j(a) & top-j(b)| / j. Three candidates:
    e = [math.exp(3), math.exp(2), math.exp(1)]
    w = [x / sum(e) for x in e]
    # fact 1: the top two swapped -> P@1 = 0, P@2 = 1, P@3 = 1
    # fact 2: the same ranking   -> 1
    # fact 3: reversed           -> P@1 = 0, P@2 = 1/2, P@3 = 1
    expected = [w[1] + w[2], 1.0, 0.5 * w[1] + w[2]]
    assert rankc_fact([0, 1, 2], [1, 0, 2]) == pytest.approx(expected[0])
    assert rankc_fact([2, 0, 1], [2, 0, 1]) == pytest.approx(1.0)
    assert rankc_fact([0, 1, 2], [2, 1, 0]) == pytest.approx(expected[2])
    recs = [
        {"id": "f1", "lang": "en", "ranking": [0, 1, 2]},
        {"id": "f1", "lang": "fr", "ranking": [1, 0, 2]},
        {"id": "f2", "lang": "en", "ranking": [2, 0, 1]},
        {"id": "f2", "lang": "fr", "ranking": [2, 0, 1]},
        {"id": "f3", "lang": "en", "ranking": [0, 1, 2]},
        {"id": "f3", "lang": "fr", "ranking": [2, 1, 0]},
        {"id": "f4", "lang": "en", "ranking": [0, 1]},  # no fr ranking: not counted
    ]
    out = rankc(recs)["en|fr"]
    assert out["n"] == 3 and out["estimate"] == pytest.approx(sum(expected) / 3)
    assert out["lo"] <= out["estimate"] <= out["hi"]


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def _cloze_jsonl(path, facts):
    path.write_text("".join(json.dumps(f.to_json(), ensure_ascii=False) + "\n" for f in facts))
    return path


def _with_candidates(facts):
    """Bundled facts with a candidate set written here: the answer and three other answers
    of the same language, the gold at a position that varies with the fact."""
    by_lang: dict[str, list[Fact]] = {}
    for f in facts:
        by_lang.setdefault(f.lang, []).append(f)
    out = []
    for fs in by_lang.values():
        answers = sorted({f.answer for f in fs})
        for k, f in enumerate(sorted(fs, key=lambda g: g.id)):
            others = [a for a in answers if a != f.answer][:3]
            cands = others[: k % 4] + [f.answer] + others[k % 4 :]
            out.append(replace(f, candidates=tuple(cands), suffix="."))
    return out


def test_steer_eval_under_rank_on_tiny(tiny_dir, tmp_path):
    from mechlingo.cli import main

    facts = _with_candidates(load_facts(langs=["en", "fr", "de"], relations=["capital"],
                                        limit=24, templates="natural"))  # fmt: skip
    data = _cloze_jsonl(tmp_path / "cloze.jsonl", facts)
    common = ["--model", str(tiny_dir), "--langs", "en,fr,de", "--facts", str(data), "--quiet"]
    vdir, out = tmp_path / "v", tmp_path / "e"
    assert main(["steer", "build", *common, "--k-shot", "2", "--out", str(vdir)]) == 0
    grid = ["--task-layers", "0", "--diff-layers", "1", "--task-alphas", "0.5",
            "--diff-alphas", "0.5", "--top-k", "1", "--screen-ids", "2"]  # fmt: skip
    rc = main(["steer", "eval", *common, "--vectors", str(vdir), *grid, "--metric", "rank",
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["metric"] == {"metric": "rank", "rank_tokens": "sentence"}
    assert s["sweep"]["metric"]["metric"] == "rank" and s["skipped"] == {}
    assert set(s["headroom"]["k_shot"]) == {"en", "fr", "de"}
    assert s["mcnemar_vs_random"]["both"].keys() == {"random_s0", "random_s1", "random_s2"}
    assert set(s["metric_summary"]["orig"]["rankc"]) == {"de|en", "de|fr", "en|fr"}
    recs = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    assert {r["condition"] for r in recs} >= {"orig", "task", "diff", "both", "random_s0"}
    assert all("gold_rank" in r for r in recs)
    # the transfer matrix scores every cell with the same metric (external transfer)
    assert main(["steer", "eval", *common, "--vectors", str(vdir), "--metric", "rank",
                 "--transfer", "lang", "--transfer-ids", "3,1,2,2", "--transfer-cells",
                 "diagonal", "--out", str(tmp_path / "t")]) == 0  # fmt: skip
    t = json.loads((tmp_path / "t" / "summary.json").read_text())["transfer"]["lang"]
    assert "rank" in json.dumps(t["meta"]["score_kw"]) and all(c["n"] > 0 for c in t["cells"])
    assert main(["steer", "eval", *common, "--vectors", str(vdir), "--metric", "klar",
                 "--transfer", "--out", str(tmp_path / "t2")]) == 2  # fmt: skip
    # klar: its demonstrations come from the build split only, headroom is 0- vs k-shot
    rc = main(["steer", "eval", *common, "--vectors", str(vdir), "--config", "0,0.1,1,0.1",
               "--metric", "klar", "--out", str(tmp_path / "k")])  # fmt: skip
    assert rc == 0
    s = json.loads((tmp_path / "k" / "summary.json").read_text())
    assert s["metric"]["metric"] == "klar" and set(s["metric_summary"]["orig"]["clc"]) >= {"en"}
    split = split_facts(facts, (0.4, 0.2, 0.4))
    build_lines = {f"{f.prompt} {f.answer}" for f in split["build"]}
    test_ids = {f.id for f in split["test"]}
    recs = [json.loads(x) for x in (tmp_path / "k" / "generations.jsonl").read_text().split("\n")
            if x]  # fmt: skip
    assert recs and {r["id"] for r in recs} <= test_ids
    for r in recs:
        demos = r["prompt"].split("\n")[:-1]
        assert len(demos) == r["shots"] > 0 and set(demos) <= build_lines


@pytest.mark.slow
def test_eval_rank_and_klar_on_the_embedded_model(tmp_path, gemma, monkeypatch):
    from mechlingo.cli import common, main
    from mechlingo.cli.validate import check_after_load

    def session_model(args, **data):  # the session's embedded model, checked as the CLI does
        check_after_load(gemma, args, **data)
        return gemma

    monkeypatch.setattr(common, "load_cli_model", session_model)

    facts = [
        _fact(1, "en", "The capital of France is", "Paris", ["Rome", "Paris", "Oslo"], "."),
        _fact(2, "en", "The capital of Italy is", "Rome", ["Rome", "Paris", "Oslo"], "."),
        _fact(1, "fr", "La capitale de la France est", "Paris", ["Rome", "Paris", "Oslo"], "."),
        _fact(2, "fr", "La capitale de l'Italie est", "Rome", ["Rome", "Paris", "Oslo"], "."),
        _fact(
            3,
            "en",
            "",
            "Oslo",
            ["Oslo", "Rome", "Paris"],
            " is the capital of Norway.",
            subject="Norway",
        ),
        _fact(
            3,
            "fr",
            "",
            "Oslo",
            ["Oslo", "Rome", "Paris"],
            " est la capitale de la Norvège.",
            subject="Norvège",
        ),
    ]
    data = _cloze_jsonl(tmp_path / "cloze.jsonl", facts)
    common = ["eval", "--facts", str(data), "--langs", "en,fr", "--quiet"]
    assert main([*common, "--metric", "rank", "--out", str(tmp_path / "r")]) == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["metric"]["metric"] == "rank" and s["skipped"] == {}
    assert s["accuracy_ci"]["en"]["n"] == 3 and s["rankc"]["en|fr"]["n"] == 3
    assert s["p_at_1"]["en"]["estimate"] >= 2 / 3  # the embedded model ranks these capitals right
    assert "RankC" in (tmp_path / "r" / "report.html").read_text()
    assert main([*common, "--metric", "klar", "--out", str(tmp_path / "k")]) == 0
    s = json.loads((tmp_path / "k" / "summary.json").read_text())
    assert s["skipped"] == {SKIP_NO_STEM: 2} and s["accuracy_ci"]["fr"]["n"] == 2
    assert set(s["clc"]) == {"en", "fr"} and s["clc"]["en"]["estimate"] in (0.0, 1.0)
    recs = [json.loads(x) for x in (tmp_path / "k" / "generations.jsonl").read_text().split("\n")
            if x]  # fmt: skip
    assert all(r["shots"] == 1 and r["prompt"].count("\n") == 1 for r in recs)


@pytest.mark.slow
def test_eval_on_benchmark_fixture_folders(tmp_path, gemma, monkeypatch):
    """`eval --facts BMLAMA_DIR --metric rank` and `eval --facts KLAR_DIR --metric klar` read the
    benchmark layouts (hand-written fixtures, tests/bench_fixtures.py) and write a report."""
    from mechlingo.cli import common, main
    from mechlingo.cli.validate import check_after_load
    from tests.bench_fixtures import write_fixture

    def session_model(args, **data):
        check_after_load(gemma, args, **data)
        return gemma

    monkeypatch.setattr(common, "load_cli_model", session_model)
    bm = write_fixture("bmlama", tmp_path / "bm")
    assert main(["eval", "--facts", str(bm), "--langs", "en,ja", "--metric", "rank",
                 "--quiet", "--out", str(tmp_path / "r")]) == 0  # fmt: skip
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["metric"]["metric"] == "rank" and s["meta"]["data_format"] == "bmlama"
    assert s["accuracy_ci"]["en"]["n"] == s["accuracy_ci"]["ja"]["n"] > 0
    assert "en|ja" in s["rankc"] and (tmp_path / "r" / "report.html").is_file()
    klar = write_fixture("klar", tmp_path / "klar")
    assert main(["eval", "--facts", str(klar), "--langs", "en,fr", "--metric", "klar",
                 "--quiet", "--out", str(tmp_path / "k")]) == 0  # fmt: skip
    s = json.loads((tmp_path / "k" / "summary.json").read_text())
    assert s["metric"]["metric"] == "klar" and s["meta"]["data_format"] == "klar"
    assert set(s["clc"]) == {"en", "fr"} and (tmp_path / "k" / "report.html").is_file()


def test_trace_adds_the_gold_rank_per_class(tiny):
    from mechlingo.analyses.recall.trace import trace_recall

    plain = Fact("capital/9", "capital", "en", "X", "The capital of Peru is", "Lima")
    tr = trace_recall(tiny, [*FACTS[:3], plain, FACTS[3]], max_new_tokens=2)
    assert tr.meta["skipped"] == {SKIP_NO_STEM: 1}  # the mask-first fact has no stem
    ranked = evaluate_facts(tiny, FACTS[:3], metric="rank")
    want = {(r["id"], r["lang"]): r["gold_rank"] for r in ranked.records}
    got = {(r["id"], r["lang"]): r["gold_rank"] for r in tr.records}
    assert got == {**want, ("capital/9", "en"): None}
    by_class = tr.summary()["gold_rank_by_class"]
    for lg, classes in by_class.items():
        for c, stats in classes.items():
            ranks = [r["gold_rank"] for r in tr.records
                     if r["lang"] == lg and r["class"] == c and r["gold_rank"] is not None]  # fmt: skip
            assert stats["n"] == len(ranks) and stats["estimate"] == pytest.approx(np.mean(ranks))


def test_eval_cli_counts_skips_and_refuses_a_metric_that_scores_nothing(tiny_dir, tmp_path):
    from mechlingo.cli import main

    plain = Fact("capital/9", "capital", "en", "The", "The capital of Peru is", "Lima",
                 subject_span=(0, 3))  # fmt: skip
    data = _cloze_jsonl(tmp_path / "mixed.jsonl", [*FACTS[:2], plain])
    common = ["eval", "--model", str(tiny_dir), "--facts", str(data), "--langs", "en"]
    out = tmp_path / "r"
    assert main([*common, "--metric", "rank", "--quiet", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["skipped"] == {SKIP_NO_CANDIDATES: 1}
    assert s["accuracy_ci"]["en"]["n"] == 2
    assert s["p_at_1"]["en"]["n"] == 2 and "Skipped under rank" in (out / "report.html").read_text()
    only_plain = _cloze_jsonl(tmp_path / "plain.jsonl", [plain])
    bad = tmp_path / "bad"
    args = ["eval", "--model", str(tiny_dir), "--facts", str(only_plain), "--langs", "en"]
    assert main([*args, "--metric", "rank", "--quiet", "--out", str(bad)]) == 2
    assert not bad.exists()

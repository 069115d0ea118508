"""Several conditions scored on shared prefixes equal each condition scored alone."""

from __future__ import annotations

import pytest
import torch

from mechlingo.activations import prefix
from mechlingo.activations.decoding import decode_cached, kv_cache_path
from mechlingo.activations.prefix import cache_upto, decode_conditions, record_head
from mechlingo.core.tokens import TokenBatch, encode
from mechlingo.data import load_facts
from mechlingo.interventions.apply import first_edit
from mechlingo.interventions.base import Gated, Intervention
from mechlingo.interventions.steering import SteeringVector
from mechlingo.scoring import evaluate as ev
from mechlingo.scoring.evaluate import (
    DecodeOptions,
    evaluate_conditions,
    evaluate_facts,
    generate_conditions,
    greedy_generate,
)
from mechlingo.scoring.rank import score_candidates
from tests.conftest import count_hooks
from tests.scoring.test_scorers import FACTS

PROMPTS = ["The capital of Italy is", "La capitale", "Die Hauptstadt von Frankreich ist die"]
RULES = ["last", "generated", "last+generated", 2, -2, "all"]


def _vec(model, seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(int(model.cfg.d_model), generator=g) * scale


def _conditions(model, layer: int, scale: float) -> dict[str, Intervention | None]:
    """One condition per positions rule, a composition and a language gate."""
    conds: dict[str, Intervention | None] = {"orig": None}
    for i, rule in enumerate(RULES):
        conds[f"rule_{rule}"] = SteeringVector(_vec(model, i, scale), layer, positions=rule)
    task = SteeringVector(_vec(model, 10, scale), layer)
    diff = SteeringVector(_vec(model, 11, scale), max(0, layer - 1))
    conds["both"] = task + diff
    conds["gated"] = Gated(task + diff, {"en"}, exclude=True)
    return conds


class _Boom(Intervention):
    """An intervention whose hook raises (to check that hooks are removed)."""

    kind = "Boom"

    def __init__(self) -> None:
        self.meta = {}

    def fwd_hooks(self, model):
        def hook(t, hook):
            raise RuntimeError("boom")

        return [("blocks.0.hook_resid_pre", hook)]

    def _tensors(self):
        return {}

    def _config(self):
        return {}

    @classmethod
    def _restore(cls, tensors, config):
        return cls()


def test_first_edit_follows_the_position_rules(tiny):
    b = encode(tiny, PROMPTS)
    n = b.lengths
    vec = _vec(tiny, 0, 1.0)
    want = {
        "last": n - 1,
        "generated": n,
        "last+generated": n - 1,
        2: torch.full_like(n, 2),
        -2: n - 2,
        "all": torch.zeros_like(n),
    }
    for rule, w in want.items():
        assert torch.equal(first_edit(SteeringVector(vec, 1, positions=rule), b), w), rule
    assert torch.equal(first_edit(None, b), n)
    combo = SteeringVector(vec, 1) + SteeringVector(vec, 0, positions=[1, 3])
    assert torch.equal(first_edit(combo, b), torch.ones_like(n))
    assert torch.equal(first_edit(combo.only_for({"fr"}), b), torch.ones_like(n))
    assert torch.equal(first_edit(_Boom(), b), torch.zeros_like(n))  # unknown kind: all


def test_decode_conditions_equals_each_condition_alone(tiny):
    b = encode(tiny, PROMPTS)  # right-padded rows of three lengths
    conds = [iv for iv in _conditions(tiny, 1, 4.0).values() if iv is not None]
    hooks = [[], *[iv.fwd_hooks(tiny) for iv in conds]]
    alone = [
        decode_cached(tiny, b, max_new_tokens=6, fwd_hooks=h, path=kv_cache_path(tiny))
        for h in hooks
    ]
    assert len({str(a) for a in alone}) > 3  # the conditions differ, so equality can fail
    for d in (0, 1, 2, int(b.lengths.min()) - 1):
        kept = [c for c, iv in enumerate([None, *conds]) if d == 0 or _safe(iv, b, d)]
        assert len(kept) >= 3
        got = decode_conditions(tiny, b, [hooks[c] for c in kept], d, max_new_tokens=6)
        assert got == [alone[c] for c in kept], d
    assert count_hooks(tiny) == 0


def _safe(iv, b, d) -> bool:
    """Whether ``iv`` leaves every row's positions before its last ``d`` unedited."""
    return iv is None or bool((first_edit(iv, b) >= b.lengths - d).all())


@pytest.mark.parametrize("metric", ["generate", "klar"])
def test_evaluate_conditions_equals_evaluate_facts(tiny, metric):
    facts = load_facts(langs=["en", "fr", "de"], relations=["capital"], limit=5)
    conds = _conditions(tiny, 1, 4.0)
    got = evaluate_conditions(
        tiny, facts, conds, metric=metric, decoding=DecodeOptions(max_new_tokens=5, batch_size=4)
    )
    assert set(got) == set(conds)
    gens = set()
    for name, iv in conds.items():
        want = evaluate_facts(
            tiny,
            facts,
            intervention=iv,
            metric=metric,
            decoding=DecodeOptions(max_new_tokens=5, batch_size=4),
        )
        assert got[name].records == want.records, name
        # klar's prompts outgrow the tiny model's 64-token sliding window: decoded alone
        assert got[name].meta["path"] == (
            "shared-prefix" if metric == "generate" else "per-condition"
        )
        gens.add(tuple(r["generation"] for r in want.records))
    assert len(gens) > 3
    assert count_hooks(tiny) == 0


def test_left_padding_tokenizer_and_uncached_reference(tiny):
    conds = _conditions(tiny, 1, 4.0)
    ivs = list(conds.values())
    ref, path = generate_conditions(
        tiny, PROMPTS, ivs, decoding=DecodeOptions(max_new_tokens=5, cache=False)
    )
    assert path == "per-condition"
    side = tiny.tokenizer.padding_side
    for pad in ("left", "right"):
        tiny.tokenizer.padding_side = pad
        try:
            got, path = generate_conditions(
                tiny, PROMPTS, ivs, decoding=DecodeOptions(max_new_tokens=5, batch_size=3)
            )
        finally:
            tiny.tokenizer.padding_side = side
        assert path == "shared-prefix" and got == ref, pad
    for c, iv in enumerate(ivs):
        assert (
            greedy_generate(
                tiny, PROMPTS, intervention=iv, decoding=DecodeOptions(max_new_tokens=5)
            )
            == ref[c]
        )


def test_refused_cache_falls_back_and_says_so(tiny, monkeypatch):
    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=3)
    conds = _conditions(tiny, 1, 4.0)
    shared = evaluate_conditions(tiny, facts, conds, decoding=DecodeOptions(max_new_tokens=4))
    monkeypatch.setattr(prefix, "prefix_reuse_supported", lambda model, length: False)
    monkeypatch.setattr(ev, "shared_decoding_supported", prefix.shared_decoding_supported)
    old = evaluate_conditions(tiny, facts, conds, decoding=DecodeOptions(max_new_tokens=4))
    for name in conds:
        assert old[name].meta["path"] == "per-condition"
        assert old[name].records == shared[name].records
    hooks = evaluate_conditions(
        tiny,
        facts,
        conds,
        fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: None)],
        decoding=DecodeOptions(max_new_tokens=4),
    )
    assert hooks["orig"].meta["path"] == "per-condition"


@pytest.mark.parametrize("shared", [True, False])
def test_hooks_removed_after_an_error(tiny, shared):
    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=3)
    conds = {"orig": None, "task": SteeringVector(_vec(tiny, 0, 1.0), 1), "boom": _Boom()}
    with pytest.raises(RuntimeError, match="boom"):
        evaluate_conditions(
            tiny, facts, conds, shared=shared, decoding=DecodeOptions(max_new_tokens=3)
        )
    assert count_hooks(tiny) == 0


def test_rank_and_bad_input(tiny):
    facts = FACTS
    conds = {"orig": None, "task": SteeringVector(_vec(tiny, 0, 4.0), 1)}
    got = evaluate_conditions(tiny, facts, conds, metric="rank")
    for name, iv in conds.items():
        want = evaluate_facts(tiny, facts, intervention=iv, metric="rank")
        assert got[name].records == want.records
    with pytest.raises(Exception, match="no conditions"):
        evaluate_conditions(tiny, facts, {})


@pytest.mark.slow
def test_shared_prefix_logprobs_match_on_gemma(gemma):
    """The first decoding step's log-probabilities from a shared prefix are those of the full
    prompt pass (within 1e-4) for right-padded rows of several lengths."""
    b = encode(gemma, ["The capital of France is", "La capitale de l'Allemagne est la ville de"])
    iv = SteeringVector(_vec(gemma, 0, 8.0), 6)
    seen: dict[str, list[torch.Tensor]] = {"full": [], "shared": []}

    def grab(key):
        def choose(logits):
            seen[key].append(torch.log_softmax(logits.float(), -1))
            return logits.argmax(-1)

        return choose

    hooks = iv.fwd_hooks(gemma)
    path = kv_cache_path(gemma)
    full = decode_cached(
        gemma, b, max_new_tokens=3, fwd_hooks=hooks, choose=grab("full"), path=path
    )
    rec = record_head(gemma, b, 1)  # every row but its last token, right-padded
    cache = cache_upto(gemma, rec, torch.arange(b.batch_size), b.tokens.shape[1] - 1)
    shared = decode_cached(
        gemma,
        TokenBatch(b.tokens, b.lengths, b.pad_id, b.has_bos),
        max_new_tokens=3,
        fwd_hooks=hooks,
        choose=grab("shared"),
        path=path,
        prefix=(cache, 1),
    )
    assert shared == full
    for a, c in zip(seen["full"], seen["shared"], strict=True):
        assert float((a - c).abs().max()) < 1e-4


@pytest.mark.slow
def test_default_protocol_conditions_equal_on_gemma(gemma):
    """The test conditions of the protocol (orig, task, diff, both, random controls) and a
    language gate: every record equal to scoring each condition alone. The equality holds at
    any size: three facts per language in batches of 8 keep two batches (8 + 4)."""
    facts = load_facts(langs=["en", "fr", "de", "ja"], relations=["capital"], limit=3)
    scale = 30.0
    task = SteeringVector(_vec(gemma, 1, scale), 9, 1.0)
    diff = SteeringVector(_vec(gemma, 2, scale), 12, 1.0)
    conds: dict[str, Intervention | None] = {
        "orig": None,
        "task": task,
        "diff": diff,
        "both": task + diff,
    }
    for s in range(3):
        conds[f"random_s{s}"] = SteeringVector(_vec(gemma, 20 + s, scale), 9) + SteeringVector(
            _vec(gemma, 30 + s, scale), 12
        )
    conds["gated"] = Gated(task + diff, {"en"}, exclude=True)
    conds["last+generated"] = SteeringVector(_vec(gemma, 3, scale), 9, positions="last+generated")
    got = evaluate_conditions(
        gemma, facts, conds, decoding=DecodeOptions(max_new_tokens=6, batch_size=8)
    )
    gens = set()
    for name, iv in conds.items():
        want = evaluate_facts(
            gemma, facts, intervention=iv, decoding=DecodeOptions(max_new_tokens=6, batch_size=8)
        )
        assert got[name].records == want.records, name
        assert got[name].meta["path"] == "shared-prefix"
        gens.add(tuple(r["generation"] for r in want.records))
    assert len(gens) > 3
    assert count_hooks(gemma) == 0


def _per_condition(monkeypatch) -> None:
    """Every batch decoded one condition at a time (the path before shared prefixes)."""
    monkeypatch.setattr(ev, "shared_decoding_supported", lambda *a: False)


def test_protocol_and_transfer_equal_the_per_condition_path(tiny, monkeypatch):
    from mechlingo.analyses.recall import steer_eval, steering, transfer
    from mechlingo.analyses.recall.settings import (
        BuildSettings,
        DevGrid,
        MatrixSettings,
        ScoringOptions,
    )
    from mechlingo.data.splits import split_facts

    facts = load_facts(
        langs=["en", "fr", "de"], relations=["capital", "language"], limit=24, templates="natural"
    )
    build = split_facts(facts, (0.4, 0.2, 0.4))["build"]
    vectors = steering.build_steering_vectors(
        tiny, build, BuildSettings(k_shot=2, translation_shots=0)
    )
    grid = DevGrid(
        task_layers=(0, 1),
        diff_layers=(1,),
        task_alphas=(0.5, 2.0),
        diff_alphas=(1.0, 4.0),
        top_k=2,
        screen_ids=3,
    )
    opts = steer_eval.SteerEvalOptions(
        grid=grid, seeds=(0, 1), scoring=ScoringOptions(max_new_tokens=3)
    )
    matrix = MatrixSettings(
        build_ids=3, screen_ids=2, dev_ids=2, test_ids=2, layers=(0, 1), alphas=(0.5, 2.0)
    )
    tkw = {
        "matrix": matrix,
        "build": BuildSettings(k_shot=2),
        "scoring": ScoringOptions(max_new_tokens=2),
    }
    res = steer_eval.run_steer_eval(tiny, facts, vectors, opts)
    assert {r.meta["path"] for r in res.test.results.values()} == {"shared-prefix"}
    shared = res.summary()
    matrix = transfer.transfer_matrix(tiny, facts, by="relation", **tkw).to_json()
    with monkeypatch.context() as m:
        _per_condition(m)
        alone = steer_eval.run_steer_eval(tiny, facts, vectors, opts).summary()
        matrix_alone = transfer.transfer_matrix(tiny, facts, by="relation", **tkw).to_json()
    assert len(shared["sweep"]["rows"]) > 8
    assert shared == alone
    matrix["meta"].pop("seconds"), matrix_alone["meta"].pop("seconds")
    assert matrix == matrix_alone


RANK_RULES = [None, "last", "generated", "last+generated", -1, "all"]


@pytest.mark.parametrize("tokens", ["sentence", "candidate"])
def test_rank_shared_stems_equal_whole_rows(tiny, tokens):
    """Each fact's stem run once and the candidates' tails against it: the scores of every
    candidate within 1e-4 nats of running every row whole, the same token counts and
    rankings, under interventions at several positions and a gate; the ``all`` rule edits
    the stem, so it runs whole."""
    facts = [f for f in FACTS if f.prompt]  # every fact has text before the mask
    vec = _vec(tiny, 0, 4.0)
    ivs = [None if r is None else SteeringVector(vec, 1, positions=r) for r in RANK_RULES]
    ivs.append(Gated(SteeringVector(vec, 1), {"fr"}))
    prefixes = [None, ["Q: a\nA: b\n"] * len(facts)]
    changed = 0
    for iv in ivs:
        for pre in prefixes:
            kw = {"intervention": iv, "tokens": tokens, "prefixes": pre, "batch_size": 3}
            got = score_candidates(tiny, facts, **kw)
            want = score_candidates(tiny, facts, shared=False, **kw)
            expect = "full" if getattr(iv, "positions", None) == "all" else "shared-stem"
            assert got.meta["path"] == expect and want.meta["path"] == "full"
            assert got.n_tokens == want.n_tokens
            for a, b in zip(got.ce, want.ce, strict=True):
                assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
                assert sorted(range(len(a)), key=a.__getitem__) == sorted(
                    range(len(b)), key=b.__getitem__
                )
            base = score_candidates(tiny, facts, tokens=tokens, prefixes=pre)
            changed += got.ce != base.ce
    assert changed >= len(ivs)  # the interventions change the scores, so equality can fail
    assert count_hooks(tiny) == 0


@pytest.mark.slow
def test_rank_shared_stems_on_gemma(gemma):
    facts = [f for f in FACTS if f.prompt]
    iv = SteeringVector(_vec(gemma, 0, 20.0), 6)
    for i in (None, iv):
        got = score_candidates(gemma, facts, intervention=i)
        want = score_candidates(gemma, facts, intervention=i, shared=False)
        assert got.meta["path"] == "shared-stem"
        for a, b in zip(got.ce, want.ce, strict=True):
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4


DEMOS = {
    "en": "The capital of Spain is Madrid.\nThe capital of Peru is Lima.\n",
    "fr": "La capitale du Japon est Tokyo.\n",
    "de": "Die Hauptstadt von Chile ist Santiago.\n",
    "ja": "ペルーの首都はリマです。\n",
}


def _demo_facts():
    """FACTS twice (other ids), so every language's demonstrations precede 2+ queries."""
    from dataclasses import replace

    return [*FACTS, *(replace(f, id=f"{f.id}b") for f in FACTS)]


def _count_demo_passes(monkeypatch) -> list[int]:
    from mechlingo.scoring import rank

    calls: list[int] = []
    real = rank._stems_on_demos

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(rank, "_stems_on_demos", counted)
    return calls


@pytest.mark.parametrize("tokens", ["sentence", "candidate"])
def test_rank_demonstrations_run_once_per_pass(tiny, tokens, monkeypatch):
    """Facts whose queries follow the same demonstrations (one prefix per language) share
    them: one demonstration row per language per pass, each stem's own tokens against it.
    Scores within 1e-4 nats of every row whole, under no intervention, ``last``, an int
    position and a gate; a fact with no text before the mask (ja) included."""
    facts = _demo_facts()
    pre = [DEMOS[f.lang] for f in facts]
    calls = _count_demo_passes(monkeypatch)
    vec = _vec(tiny, 1, 4.0)
    ivs = [None, SteeringVector(vec, 1), SteeringVector(vec, 1, positions=-1),
           Gated(SteeringVector(vec, 1), {"fr", "en"})]  # fmt: skip
    for iv in ivs:
        kw = {"intervention": iv, "tokens": tokens, "prefixes": pre, "batch_size": 4}
        n = len(calls)
        got = score_candidates(tiny, facts, **kw)
        want = score_candidates(tiny, facts, shared=False, **kw)
        assert len(calls) > n, "the demonstrations were not shared"
        assert got.meta["path"] == "shared-stem" and got.n_tokens == want.n_tokens
        for a, b in zip(got.ce, want.ce, strict=True):
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
    assert count_hooks(tiny) == 0


def test_rank_demonstrations_not_shared_without_a_common_prefix(tiny, monkeypatch):
    """No prefix: every stem runs whole, as before (the demonstration pass never runs)."""
    calls = _count_demo_passes(monkeypatch)
    got = score_candidates(tiny, _demo_facts())
    assert got.meta["path"] == "shared-stem" and not calls


@pytest.mark.slow
def test_rank_demonstrations_on_gemma(gemma, monkeypatch):
    facts = _demo_facts()
    pre = [DEMOS[f.lang] for f in facts]
    calls = _count_demo_passes(monkeypatch)
    for i in (None, SteeringVector(_vec(gemma, 0, 20.0), 6)):
        got = score_candidates(gemma, facts, intervention=i, prefixes=pre)
        want = score_candidates(gemma, facts, intervention=i, prefixes=pre, shared=False)
        for a, b in zip(got.ce, want.ce, strict=True):
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
    assert calls


def test_greedy_next_in_row_chunks_is_the_plain_argmax(tiny):
    """More rows than one screened arg-max chunk (stacked conditions): every row's token is
    the float32 arg-max of its logits."""
    from mechlingo.kernels.readout import _ARGMAX_ROWS, final_logits, greedy_next

    g = torch.Generator().manual_seed(0)
    resid = torch.randn(2 * _ARGMAX_ROWS + 7, int(tiny.cfg.d_model), generator=g)
    assert torch.equal(greedy_next(tiny, resid), final_logits(tiny, resid).argmax(-1))


def test_prefix_memo_reuses_passes_and_changes_no_outcome(tiny):
    """Scoring the same prompts again inside ``reusing_prefixes`` takes every prefix pass
    from the memo, under other interventions too, with the outcomes of scoring without it;
    edited weights miss, a memo of 0 bytes keeps nothing, and the block always closes."""
    from mechlingo.activations.memo import PrefixMemo, current_memo, reusing_prefixes

    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=4)
    first, other = _conditions(tiny, 1, 4.0), _conditions(tiny, 0, 2.0)
    want = [
        evaluate_conditions(tiny, facts, c, decoding=DecodeOptions(max_new_tokens=4))
        for c in (first, other)
    ]
    memo = PrefixMemo()
    with reusing_prefixes(memo):
        got = [
            evaluate_conditions(tiny, facts, c, decoding=DecodeOptions(max_new_tokens=4))
            for c in (first, other)
        ]
    assert memo.misses > 0 and memo.hits == memo.misses  # the second call ran none
    for g, w in zip(got, want, strict=True):
        assert {n: r.records for n, r in g.items()} == {n: r.records for n, r in w.items()}
    W = tiny.W_U
    with torch.no_grad():
        W.mul_(1.0)  # a new version of the same weights
    before = memo.misses
    with reusing_prefixes(memo):
        evaluate_conditions(tiny, facts, first, decoding=DecodeOptions(max_new_tokens=4))
    assert memo.misses == 2 * before
    empty = PrefixMemo(max_bytes=0)
    with reusing_prefixes(empty):
        again = evaluate_conditions(tiny, facts, first, decoding=DecodeOptions(max_new_tokens=4))
    assert empty.stats()["records"] == 0 and empty.hits == 0
    assert {n: r.records for n, r in again.items()} == {n: r.records for n, r in want[0].items()}
    with pytest.raises(RuntimeError, match="boom"), reusing_prefixes(memo):
        evaluate_conditions(
            tiny, facts, {"orig": None, "boom": _Boom()}, decoding=DecodeOptions(max_new_tokens=3)
        )
    assert current_memo() is None and count_hooks(tiny) == 0

"""Distributed statistics: 2 CPU processes (torchrun, gloo) equal one process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from mechlingo.activations.pooled import pooled_neuron_acts
from mechlingo.activations.runs import last_token_means
from mechlingo.core.distributed import (
    DistributedError,
    all_gather_rows,
    all_reduce_state,
    dist_info,
    is_main,
    map_sharded,
    process_group,
    shard,
    shard_bounds,
    shard_by_cost,
    sharded_scoring,
)
from mechlingo.scoring.evaluate import DecodeOptions
from tests.forks import free_port, torchrun

PROMPTS = [
    "The capital of Italy is",
    "La capitale de l'Italie est",
    "Die Hauptstadt von Italien ist",
    "La capital de Italia es la ciudad de",
    "イタリアの首都は",
    "The capital of France is the city of",
    "Столица Италии —",
]
TEXTS = {
    "en": ["The capital of Italy is Rome.", "Rome is old.", "It rains."],
    "fr": ["La capitale de l'Italie est Rome.", "Il pleut."],
    "de": ["Die Hauptstadt von Italien ist Rom.", "Es regnet heute sehr.", "Ja."],
}

# One torchrun launch (:func:`two_processes`) runs both workers' checks in one process group,
# each rank writing ``rank{r}.pt`` (the statistics, STATS_PART) and ``scores{r}.json`` (the
# sharded scoring, SCORING_PART); the tests assert on their own files.
STATS_PART = textwrap.dedent(
    """
    def stats_part(info, model_dir, out_dir, prompts, texts):
        model = load_model(model_dir, device="cpu")
        means = last_token_means(model, prompts, batch_size=2)
        acts = pooled_neuron_acts(model, texts, batch_size=2)
        # uneven row counts (rank 0: 3 rows, rank 1: 1 row) and an int state
        rows = torch.full((3 if info.rank == 0 else 1, 2), float(info.rank))
        gathered = all_gather_rows(rows)
        state = all_reduce_state({"n": torch.tensor([info.rank + 1], dtype=torch.int64)})
        torch.save(
            {
                "info": (info.rank, info.world_size, info.backend, is_main()),
                "shard": shard(list(range(5))),
                "mean": means.mean, "count": means.count,
                "pooled": acts.pooled, "lang_ids": acts.lang_ids, "prob": acts.prob_active,
                "gathered": gathered, "state": state["n"],
            },
            f"{out_dir}/rank{info.rank}.pt",
        )
    """
)


def test_shard_bounds_cover_in_order():
    for n in (0, 1, 5, 7, 16):
        for world in (1, 2, 3, 4):
            parts = [shard_bounds(n, r, world) for r in range(world)]
            flat = [i for p in parts for i in p]
            assert flat == list(range(n))
            sizes = [len(p) for p in parts]
            assert max(sizes) - min(sizes) <= 1
    assert shard(list("abcde"), 1, 2) == ["c", "d", "e"]
    assert shard(list("abcde")) == list("abcde")  # single process: everything
    with pytest.raises(DistributedError):
        shard_bounds(3, 2, 2)


def test_shard_by_cost_balances_and_covers_once():
    """Longest-first to the least-loaded rank: every index once, and the ranks' totals differ
    by at most the largest cost (by hand: 8 -> r0, 7 -> r1, 5 -> r1 (7 < 8), 4 -> r0, 1 -> r0
    (12 = 12, the lower rank)."""
    costs = [4, 8, 1, 7, 5]
    assert shard_by_cost(costs, 0, 2) == [0, 1, 2]  # 4 + 8 + 1 = 13
    assert shard_by_cost(costs, 1, 2) == [3, 4]  # 7 + 5 = 12
    # sorted batches: contiguous halves put the long ones on one rank; by cost they balance
    lengths = list(range(1, 21))
    for world in (2, 3):
        parts = [shard_by_cost(lengths, r, world) for r in range(world)]
        assert sorted(i for p in parts for i in p) == list(range(20))
        loads = [sum(lengths[i] for i in p) for p in parts]
        assert max(loads) - min(loads) <= max(lengths)
        contiguous = [sum(lengths[i] for i in shard_bounds(20, r, world)) for r in range(world)]
        assert max(loads) < max(contiguous)
    assert shard_by_cost([3, 2]) == [0, 1]  # a single process owns everything
    with pytest.raises(DistributedError):
        shard_by_cost([1], 2, 2)


def test_map_sharded_in_one_process_is_the_loop(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with sharded_scoring():
        assert map_sharded(lambda x: x * x, [3, 1, 2], costs=[1, 5, 2]) == [9, 1, 4]
        assert map_sharded(str, []) == []


def test_single_process_helpers_are_identity(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with process_group() as info:
        assert (info.rank, info.world_size, info.backend) == (0, 1, None)
        assert is_main()
        x = torch.arange(6.0).reshape(3, 2)
        assert all_gather_rows(x) is x
        state = {"sum": torch.ones(2, dtype=torch.float64)}
        out = all_reduce_state(state)
        assert torch.equal(out["sum"], state["sum"]) and out["sum"] is not state["sum"]


def test_env_errors(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(DistributedError, match="torchrun"), process_group():
        pass
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(DistributedError, match="not an integer"):
        dist_info()


def test_single_process_equals_core_functions(tiny):
    """World size 1: the building blocks equal last_token_means / collect_neuron_stats."""
    ref = last_token_means(tiny, PROMPTS, batch_size=3)
    got = last_token_means(tiny, PROMPTS, batch_size=2)
    assert got.layers == ref.layers and got.count == len(PROMPTS)
    torch.testing.assert_close(got.mean, ref.mean, rtol=1e-5, atol=1e-5)

    from mechlingo.analyses.experts import collect_neuron_stats

    stats = collect_neuron_stats(tiny, TEXTS, batch_size=2)
    acts = pooled_neuron_acts(tiny, TEXTS, batch_size=3)
    torch.testing.assert_close(acts.pooled, stats.pooled, rtol=1e-5, atol=1e-6)
    assert torch.equal(acts.lang_ids.cpu(), stats.lang_ids.cpu())
    torch.testing.assert_close(acts.prob_active.float(), stats.prob_active.float())
    ns = acts
    assert ns.langs == list(TEXTS) and ns.pooled.shape == stats.pooled.shape


def test_pooled_acts_errors(tiny):
    with pytest.raises(ValueError, match="no sentences"):
        pooled_neuron_acts(tiny, {"en": ["a"], "fr": []})
    with pytest.raises(ValueError, match="pool"):
        pooled_neuron_acts(tiny, TEXTS, pool="median")  # type: ignore[arg-type]


def test_two_processes_equal_one(tiny, two_processes):
    """torchrun --nproc_per_node 2 (gloo, CPU; forked ranks) gives the one-process statistics
    on every rank."""
    out_dir, proc = two_processes
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    ref_means = last_token_means(tiny, PROMPTS, batch_size=4)
    ref_acts = pooled_neuron_acts(tiny, TEXTS, batch_size=4)
    for rank in (0, 1):
        out = torch.load(out_dir / f"rank{rank}.pt")
        assert out["info"] == (rank, 2, "gloo", rank == 0)
        assert out["shard"] == ([0, 1] if rank == 0 else [2, 3, 4])
        assert out["count"] == len(PROMPTS)
        torch.testing.assert_close(out["mean"], ref_means.mean, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(out["pooled"], ref_acts.pooled, rtol=1e-4, atol=1e-5)
        assert torch.equal(out["lang_ids"], ref_acts.lang_ids)
        torch.testing.assert_close(out["prob"], ref_acts.prob_active)
        assert out["gathered"].tolist() == [[0.0, 0.0]] * 3 + [[1.0, 1.0]]
        assert out["state"].tolist() == [3]


# --------------------------------------------------------------------------------------
# Models split over devices (device_map). Only CPU here: an all-CPU map and a map that
# offloads a block to disk (accelerate's dispatch hooks run, as on a multi-GPU split).
# --------------------------------------------------------------------------------------

LENS_ANSWERS = {"answer": ["Rome", "Rome", "Rom", "Roma", "ローマ", "Paris", "Рим"]}


def _tiny_map(block1: str) -> dict[str, str]:
    # Gemma ties lm_head to embed_tokens: tied modules must share a device.
    return {
        "model.embed_tokens": "cpu",
        "model.rotary_emb": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": block1,
        "model.norm": "cpu",
        "lm_head": "cpu",
    }


def _same_results(ref, model) -> None:
    from mechlingo.activations.runs import collect
    from mechlingo.analyses.decoders.lens import logit_lens
    from mechlingo.core.sites import hook_name
    from mechlingo.core.tokens import encode
    from mechlingo.interventions import SteeringVector

    a = logit_lens(ref, PROMPTS, LENS_ANSWERS, batch_size=3)
    b = logit_lens(model, PROMPTS, LENS_ANSWERS, batch_size=3)
    torch.testing.assert_close(a.logprob, b.logprob, rtol=1e-5, atol=1e-5)
    assert torch.equal(a.rank, b.rank)
    # an intervention's hook on the dispatched block, read at a later hook
    v = torch.randn(ref.cfg.d_model, generator=torch.Generator().manual_seed(3))
    sv = SteeringVector(v, layer=1, alpha=3.0)
    name = hook_name(ref, "resid_post", 1)
    outs = [
        collect(m, encode(m, PROMPTS), [name], fwd_hooks=sv.fwd_hooks(m))[name]
        for m in (ref, model)
    ]
    torch.testing.assert_close(outs[0], outs[1].to(outs[0].device), rtol=1e-5, atol=1e-5)
    m1 = last_token_means(ref, PROMPTS)
    m2 = last_token_means(model, PROMPTS)
    torch.testing.assert_close(m1.mean, m2.mean.to(m1.mean.device), rtol=1e-6, atol=1e-6)


def test_device_map_all_cpu(tiny, tiny_dir):
    from mechlingo.core.models import ModelLoadError, load_model

    model = load_model(tiny_dir, device_map=_tiny_map("cpu"))
    assert str(model.cfg.device) == "cpu"
    _same_results(tiny, model)
    with pytest.raises(ModelLoadError, match="either device or device_map"):
        load_model(tiny_dir, device="cpu", device_map="auto")


def test_device_map_disk_offload_block(tiny, tiny_dir, tmp_path):
    """Block 1 offloaded to disk: accelerate materialises its weights per call, through the
    same dispatch hooks a multi-GPU split uses; analyses and interventions are unchanged."""
    from transformer_lens.model_bridge import TransformerBridge

    from mechlingo.core.models import load_model

    bridge = TransformerBridge.boot_transformers(
        str(tiny_dir),
        device_map=_tiny_map("disk"),
        offload_folder=str(tmp_path / "offload"),
        dtype=torch.float32,
    )
    hf_map = getattr(bridge.original_model, "hf_device_map", {})
    assert hf_map.get("model.layers.1") == "disk"
    _same_results(tiny, load_model(bridge))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_experts_command_under_torchrun_equals_one_process(tiny_dir, tmp_path):
    """`torchrun --nproc_per_node 2 -m mechlingo.cli experts ...` computes the statistics
    data-parallel and rank 0 writes the same experts as a single-process run. The one test
    that runs the launcher as a new interpreter and its ranks as ``python -m mechlingo.cli``,
    as ``make replicate`` does; the others fork them (:func:`tests.forks.torchrun`)."""
    import csv

    from mechlingo.cli import main

    data = tmp_path / "data"
    data.mkdir()
    for lang, lines in {
        "en": ["The capital of Italy is Rome.", "Rome is old.", "It rains.", "Hello there."],
        "es": ["La capital de Italia es Roma.", "Llueve.", "Roma es antigua.", "Hola."],
        "fr": ["La capitale de l'Italie est Rome.", "Il pleut.", "Rome est ancienne.", "Salut."],
    }.items():
        (data / f"{lang}.txt").write_text("\n".join(lines) + "\n")
    args = ["experts", "--model", str(tiny_dir), "--target", "es", "--k", "4", "--parallel",
            str(data), "--langs", "en,es,fr", "--no-curve", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    (tmp_path / "tmp").mkdir()  # where the launcher leaves its torchelastic_* folder
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path / "tmp"))
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "-m", "mechlingo.cli", *args, "--out", str(tmp_path / "two")]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    def top(folder):
        with open(folder / "experts.csv") as f:
            return [(r["lang"], r["layer"], r["neuron"]) for r in csv.DictReader(f)]

    assert top(tmp_path / "two") == top(tmp_path / "one")


SCORING_PART = textwrap.dedent(
    """
    def scoring_part(info, model_dir, out_dir):
        calls, real = [], ev._decode_batch
        ev._decode_batch = lambda *a: calls.append(1) or real(*a)
        model = load_model(model_dir, device="cpu")
        facts, conds, rank_facts = scoring_inputs(model)
        with sharded_scoring():
            got = evaluate_conditions(model, facts, conds,
                                      decoding=DecodeOptions(max_new_tokens=4, batch_size=3))
            ranked = evaluate_facts(model, rank_facts, metric="rank",
                                    decoding=DecodeOptions(batch_size=1))
            batches = len(calls)
            lens, emb = lens_and_embeddings(model)
        ev._decode_batch = real
        out = {"gen": {k: v.records for k, v in got.items()}, "rank": ranked.records,
               "path": got["orig"].meta["path"], "batches": batches, "lens": lens,
               "emb": emb}
        with open(f"{out_dir}/scores{info.rank}.json", "w") as f:
            json.dump(out, f)
    """
)

CIRCUIT_PART = textwrap.dedent(
    """
    def circuit_part(info, model_dir, out_dir):
        import mechlingo.analyses.circuits.result as cr

        model = load_model(model_dir, device="cpu")
        rows, real = [], cr.edge_scores
        cr.edge_scores = lambda m, g, clean, *a, **k: rows.append(clean.batch_size) or real(
            m, g, clean, *a, **k)
        with sharded_scoring():
            res = circuit_inputs(model)
        cr.edge_scores = real
        torch.save({"scores": res.scores, "clean": res.clean, "curve": res.curve,
                    "areas": res.areas, "verified": res.verified, "facts": res.facts,
                    "rows": rows}, f"{out_dir}/circuit{info.rank}.pt")
    """
)


def circuit_inputs(model):
    """The circuit both the workers (sharded over prompts) and one process find."""
    from mechlingo.analyses.circuits import find_circuit
    from mechlingo.data import load_facts

    facts = load_facts(langs="en", relations="capital", limit=10)
    return find_circuit(model, facts, steps=2, sizes=(0, 3, 10), verify=3, batch_size=3)


def test_two_processes_find_the_circuit_of_one(tiny, two_processes):
    """find_circuit inside sharded_scoring over 2 torchrun processes: each rank scores and
    patches its share of the pairs; every rank gets the one-process scores, curve, areas and
    verified edges (to float rounding)."""
    out_dir, proc = two_processes
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = circuit_inputs(tiny)
    finally:
        torch.set_num_threads(threads)
    n = len(one.facts)
    shares = [torch.load(out_dir / f"circuit{r}.pt")["rows"] for r in (0, 1)]
    assert shares == [[n // 2], [n - n // 2]]  # each rank scored its half of the pairs
    for rank in (0, 1):
        got = torch.load(out_dir / f"circuit{rank}.pt")
        assert got["facts"] == one.facts
        torch.testing.assert_close(got["scores"], one.scores, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got["clean"], one.clean, atol=1e-5, rtol=1e-5)
        for a, b in zip(got["curve"], one.curve, strict=True):
            assert a["n_edges"] == b["n_edges"]
            assert a["faithfulness"] == pytest.approx(b["faithfulness"], abs=1e-4)
        assert got["areas"]["cpr"]["value"] == pytest.approx(one.areas["cpr"]["value"], abs=1e-4)
        assert [v["edge"] for v in got["verified"]] == [v["edge"] for v in one.verified]


WORKER = (
    textwrap.dedent(
        """
        import json, sys, torch
        from mechlingo.activations.runs import last_token_means
        from mechlingo.core.distributed import (
            all_gather_rows, all_reduce_state, dist_info, is_main, process_group, shard,
            sharded_scoring,
        )
        from mechlingo.activations.pooled import pooled_neuron_acts
        from mechlingo.core.models import load_model
        from mechlingo.scoring.evaluate import DecodeOptions, evaluate_conditions, evaluate_facts
        from tests.system.test_distributed import (
            circuit_inputs, lens_and_embeddings, scoring_inputs,
        )

        import mechlingo.scoring.evaluate as ev
        """
    )
    + SCORING_PART
    + STATS_PART
    + CIRCUIT_PART
    + textwrap.dedent(
        """
        torch.set_grad_enabled(False)
        model_dir, out_dir, prompts, texts = sys.argv[1], sys.argv[2], eval(sys.argv[3]), eval(sys.argv[4])
        with process_group() as info:
            scoring_part(info, model_dir, out_dir)
            stats_part(info, model_dir, out_dir, prompts, texts)
            circuit_part(info, model_dir, out_dir)
        """
    )
)


@pytest.fixture(scope="module")
def two_processes(tiny_dir, tmp_path_factory):
    """The folder of the one ``torchrun --nproc_per_node 2`` run of :data:`WORKER` (gloo, CPU;
    the launcher and its ranks forked from this process, :func:`tests.forks.torchrun`) shared
    by the module's two-process tests: each rank's ``rank{r}.pt`` and ``scores{r}.json``."""
    if not torch.distributed.is_available():
        pytest.skip("no torch.distributed")
    out = tmp_path_factory.mktemp("torchrun")
    script = out / "worker.py"
    script.write_text(WORKER)
    cmd = [str(script), str(tiny_dir), str(out), repr(PROMPTS), repr(TEXTS)]
    t0 = time.time()
    proc = torchrun(cmd, out / "torchrun.log")
    print(f"2-process torchrun run: {time.time() - t0:.1f}s")
    return out, proc


def scoring_inputs(model):
    """The facts and conditions of the sharded-scoring test (also used by its workers)."""
    from mechlingo.data import load_facts
    from mechlingo.interventions import SteeringVector
    from tests.scoring.test_scorers import FACTS

    facts = load_facts(langs=["en", "fr", "de"], relations=["capital"], limit=4)
    g = torch.Generator().manual_seed(0)
    v = torch.randn(int(model.cfg.d_model), generator=g) * 4
    conds = {"orig": None, "last": SteeringVector(v, 1),
             "gen": SteeringVector(-v, 0, positions="last+generated")}  # fmt: skip
    return facts, conds, FACTS


def lens_and_embeddings(model):
    """What the workers compare with one process: the logit lens's ranks and
    log-probabilities (facts of unequal lengths in batches of 2), and the mean-pooled
    embeddings of every layer (batches of 2) with one batch scored under three conditions."""
    from mechlingo.analyses.decoders.lens import lens_facts
    from mechlingo.analyses.experts.align import embed_parallel
    from mechlingo.data import load_facts

    facts = load_facts(langs=["en", "fr", "de"], relations=["capital"], limit=3)
    lens = lens_facts(model, facts, batch_size=2)
    texts = {
        "en": ["A cat.", "The weather is very fine today.", "Yes.", "We went home late"],
        "fr": ["Un chat.", "Il fait très beau aujourd'hui.", "Oui.", "Nous sommes rentrés"],
    }
    emb = embed_parallel(model, texts, layers="all", batch_size=2)
    # one batch under three conditions: fewer batches than processes, so each process takes
    # some of the conditions (a dev screen's shape)
    from mechlingo.scoring.evaluate import evaluate_conditions
    from tests.scoring.test_scorers import FACTS

    _, conds, _ = scoring_inputs(model)
    dec = DecodeOptions(max_new_tokens=3, batch_size=4)
    few = {m: evaluate_conditions(model, facts[:2] if m == "generate" else FACTS[:2], conds,
                                  metric=m, decoding=dec)
           for m in ("generate", "rank")}  # fmt: skip
    few_json = {m: {k: v.records for k, v in got.items()} for m, got in few.items()}
    return ({"rank": lens.rank.tolist(), "logprob": lens.logprob.tolist()},
            {"emb": emb.emb.tolist(), "few": few_json})  # fmt: skip


def test_two_processes_score_like_one(tiny, two_processes):
    """Scoring sharded by batch over 2 torchrun processes (gloo) gives exactly the
    one-process records, on every rank."""
    import json

    from mechlingo.scoring.evaluate import evaluate_conditions, evaluate_facts

    out_dir, proc = two_processes
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts, conds, rank_facts = scoring_inputs(tiny)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers (OMP_NUM_THREADS=1): the same reduction order
    try:
        one = evaluate_conditions(
            tiny, facts, conds, decoding=DecodeOptions(max_new_tokens=4, batch_size=3)
        )
        ranked = evaluate_facts(
            tiny, rank_facts, metric="rank", decoding=DecodeOptions(batch_size=1)
        )
        lens, emb = lens_and_embeddings(tiny)
        emb = json.loads(json.dumps(emb))
    finally:
        torch.set_num_threads(threads)
    want = json.loads(json.dumps({"gen": {k: v.records for k, v in one.items()},
                                  "rank": ranked.records, "path": "shared-prefix"}))  # fmt: skip
    for rank in (0, 1):
        got = json.loads((out_dir / f"scores{rank}.json").read_text())
        assert got.pop("batches") == 2  # 12 facts in batches of 3: two batches on each rank
        # the lens runs the one-process batches (shared by cost): exactly its reads
        assert got.pop("lens") == json.loads(json.dumps(lens))
        # each rank pools its share of the batches, regrouped: equal to float rounding
        extra = got.pop("emb")
        torch.testing.assert_close(torch.tensor(extra["emb"]), torch.tensor(emb["emb"]))
        # conditions shared out: the same generations, ranking and scores to float rounding
        for m in ("generate", "rank"):
            for k, recs in emb["few"][m].items():
                theirs = extra["few"][m][k]
                assert [r.get("generation") for r in theirs] == [r.get("generation") for r in recs]
                if m == "rank":
                    assert [r["gold_rank"] for r in theirs] == [r["gold_rank"] for r in recs]
                    flat = [[s for r in x for s in r["scores"]] for x in (theirs, recs)]
                    torch.testing.assert_close(torch.tensor(flat[0]), torch.tensor(flat[1]))
        assert got == want

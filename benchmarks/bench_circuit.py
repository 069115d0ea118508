"""Benchmark: EAP-IG edge scores over the whole computational graph, against the two ways to
get them without it, in the same run.

On the embedded model (or ``--model``): ``--pairs`` subject pairs of one language
(``--lang``, capital relation; :func:`mechlingo.analyses.circuits.make_pairs`: each fact
against another fact of the same token length), the answer's log-probability as the readout,
edges per position group (5 groups). Timed with the process's CPU clock (run it with
``OMP_NUM_THREADS=1``), best of ``--repeats``:

* EAP-IG, batched (:func:`mechlingo.analyses.circuits.edge_scores`, ``--steps`` steps, every
  pair in one pass): one corrupted forward, ``steps`` interpolated forwards and one backward;
* the same scores one pair at a time (``batch_size=1``): the naive per-prompt loop; the two
  must agree (checked, to 1e-4 relative);
* exact edge patching of every edge one by one (:class:`mechlingo.analyses.circuits.EdgePatcher`):
  ``--exact-edges`` edges (the top ones by EAP-IG) timed and extrapolated to every edge of
  the graph; their rank agreement with EAP-IG (Spearman) is printed;
* the floor: ``steps + 1`` plain forward and backward passes over the batch (the embeddings
  as the gradient's leaf, the answer's log-probability at the last token; no hooks but the
  two that make the leaf and read the last residual).

Last lines: ``eap-ig over its floor: N.Nx``, then the speed-ups (``eap-ig batched vs per
prompt``, and last ``eap-ig vs exact edge patching (extrap.)``).

    nice -n 5 env OMP_NUM_THREADS=1 python benchmarks/bench_circuit.py
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smoke import add_smoke_flag, apply_smoke, bench_model, cpu_timed  # noqa: E402

from mechlingo.activations.runs import StopForward, final_resid_name, hooked  # noqa: E402
from mechlingo.analyses.circuits import (  # noqa: E402
    EdgePatcher,
    build_graph,
    edge_scores,
    make_pairs,
    readout_fn,
)
from mechlingo.analyses.circuits.faithfulness import top_edges  # noqa: E402
from mechlingo.analyses.recall.patching.runs import repeat_batch  # noqa: E402
from mechlingo.core.tokens import batch_context  # noqa: E402
from mechlingo.data import load_facts  # noqa: E402


def floor_pass(model, batch, readout, copies: int) -> None:
    """``copies`` copies of the batch through the plain model, forward and backward: the
    embeddings made the gradient's leaf, the readout read from the last real token."""
    big = repeat_batch(batch, copies)
    rows = torch.arange(batch.batch_size).repeat(copies)
    out = {}

    def embed(t, hook):
        out["x"] = t.detach().requires_grad_(True)
        return out["x"]

    def final(t, hook):
        out["f"] = t[torch.arange(big.batch_size), big.last_index]
        raise StopForward

    with torch.enable_grad(), batch_context(big):
        with hooked(model, [("hook_embed", embed), (final_resid_name(model), final)]):
            try:
                model(big.tokens, attention_mask=big.attention_mask())
            except StopForward:
                pass
        torch.autograd.grad(readout(out["f"], rows).sum(), out["x"])


def _spearman(x: list[float], y: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic) if len(x) > 2 else float("nan")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--lang", default="en", help="language of the facts (default en)")
    ap.add_argument("--pairs", type=int, default=10, help="subject pairs (default 10)")
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG steps (default 5)")
    ap.add_argument("--exact-edges", type=int, default=20,
                    help="edges patched exactly, then extrapolated (default 20)")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=2, help="best of N (default 2)")
    add_smoke_flag(ap)
    args = apply_smoke(ap.parse_args(argv), {"pairs": 3, "steps": 2, "exact_edges": 3,
                                             "repeats": 1})  # fmt: skip
    torch.set_grad_enabled(False)
    model = bench_model(args, device=args.device)
    facts = load_facts(langs=[args.lang], relations=["capital"])
    pairs = make_pairs(model, facts[: 4 * args.pairs], pool=facts)
    keep = list(range(min(args.pairs, len(pairs.clean))))
    clean, corrupted = pairs.clean_batch.select(keep), pairs.corrupted_batch.select(keep)
    roles = pairs.roles[keep]
    graph = build_graph(model)
    readout = readout_fn(model, pairs.readout)
    n, K = len(keep), len(pairs.labels)
    total = graph.n_edges * K
    load = os.getloadavg()
    print(f"model {model.cfg.model_name}: {len(graph.senders)} senders, "
          f"{len(graph.receivers)} receivers, {graph.n_edges} edges x {K} position groups = "
          f"{total:,} edges; {n} {args.lang} pairs, {args.steps} IG steps, torch threads "
          f"{torch.get_num_threads()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip

    def score(bs: int):
        return edge_scores(model, graph, clean, corrupted, readout, roles, steps=args.steps,
                           batch_size=bs)  # fmt: skip

    score(n)  # warm-up
    (batched, cl, _), t_batched = cpu_timed(lambda: score(n), args.repeats)
    (single, _, _), t_single = cpu_timed(lambda: score(1), args.repeats)
    scale = float(batched.abs().max()) or 1.0
    gap = float((batched - single).abs().max()) / scale
    assert gap < 1e-4, f"batched and per-prompt scores differ by {gap:.2e} of the largest"
    patcher = EdgePatcher(model, graph, clean, corrupted, readout, roles, batch_size=n)
    top = top_edges(graph, batched.mean(0), args.exact_edges)
    exact, t_exact = cpu_timed(lambda: patcher.edge_effects(top, cl), 1)
    t_all = t_exact / len(top) * total
    rho = _spearman([float(batched[:, s, r, k].mean()) for s, r, k in top],
                    [float(e.mean()) for e in exact])  # fmt: skip
    _, t_floor = cpu_timed(lambda: floor_pass(model, clean, readout, args.steps + 1), args.repeats)
    print(f"EAP-IG batched: {t_batched:.2f} CPU s; one pair at a time: {t_single:.2f} CPU s "
          f"(largest difference {gap:.1e} of the largest score)")  # fmt: skip
    print(
        f"exact edge patching: {len(top)} edges in {t_exact:.2f} CPU s "
        f"({t_exact / len(top):.3f} s per edge), every edge extrapolated: {t_all:,.0f} CPU s"
    )
    print(f"Spearman, EAP-IG vs exact over the top {len(top)} edges: {rho:.2f} (n = {n} pairs)")
    print(f"floor ({args.steps + 1} forward + backward passes over the batch): "
          f"{t_floor:.2f} CPU s")  # fmt: skip
    print()
    print(f"eap-ig over its floor: {t_batched / t_floor:.1f}x")
    print(f"eap-ig batched vs per prompt: {t_single / t_batched:.1f}x")
    print(f"eap-ig vs exact edge patching (extrap.): {t_all / t_batched:.1f}x")


if __name__ == "__main__":
    main()

"""Benchmark: batched residual activation patching vs TransformerLens's per-cell patching.

Patches ``resid_pre`` over a (layers x positions) grid on the embedded model (or any model
given with ``--model``) two ways in one process, on the same clean/corrupted pair and grid:

* ``mechlingo.analyses.recall.patching.patch_activations``, the defaults (``batching="grow"``,
  prefix reuse on): source activations read once; the target run once with a key-value
  cache; then passes over every pair at once that start at the first patched position,
  attend to the cached keys and values before it, and grow by each layer's patched copies
  at that layer's block input; passes stop at the final residual stream and the last tokens
  of all rows are unembedded in one readout;
* the same with ``reuse_prefix=False`` (one pass per pair over every position, growing), and
  with ``batching="stack"`` (every copy runs the whole model), for reference;
* ``transformer_lens.patching.get_act_patch_resid_pre``-style per-cell patching
  (``generic_activation_patch`` with ``layer_pos_patch_setter`` on the same grid): one full
  forward per cell, full logits.

Prints the times, the ratios to the TransformerLens loop and the largest |difference| of the
per-example readout.

    python benchmarks/bench_patching.py                      # 18 layers x 4 positions, 4 pairs
    python benchmarks/bench_patching.py --layers 0,6,12 --positions 3 --pairs 2   # quicker
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smoke import add_smoke_flag, apply_smoke, bench_model, skipped  # noqa: E402

from mechlingo.analyses.recall.patching import answer_logprob, patch_activations  # noqa: E402
from mechlingo.core.tokens import TokenBatch, encode  # noqa: E402

CLEAN = [
    "The capital of Italy is the city of",
    "The capital of France is the city of",
    "The capital of Japan is the city of",
    "The capital of Egypt is the city of",
    "The capital of Spain is the city of",
    "The capital of Germany is the city of",
]
ANSWERS = ["Rome", "Paris", "Tokyo", "Cairo", "Madrid", "Berlin"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--layers", default=None, help="comma-separated layers (default all)")
    ap.add_argument("--positions", type=int, default=4, help="last N positions (default 4)")
    ap.add_argument("--pairs", type=int, default=4, help="clean/corrupted pairs (default 4)")
    ap.add_argument(
        "--cells-per-batch", type=int, default=None, help="default: patch_activations's"
    )
    ap.add_argument("--repeats", type=int, default=3, help="mechlingo timings: best of N")
    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, {"layers": "0,1", "positions": 2, "pairs": 2, "repeats": 1})
    torch.set_grad_enabled(False)
    model = bench_model(args, device=args.device)
    n = int(model.cfg.n_layers)
    layers = list(range(n)) if args.layers is None else [int(x) for x in args.layers.split(",")]
    k = max(2, min(args.pairs, len(CLEAN)))
    clean = encode(model, CLEAN[:k])
    width = int(clean.lengths.min())
    tokens = clean.tokens[:, :width]
    lengths = torch.full((k,), width)
    src = TokenBatch(tokens, lengths, clean.pad_id, clean.has_bos)
    bad = tokens.clone()
    bad[:, 4] = tokens.roll(1, dims=0)[:, 4]  # BOS The capital of [country]: next row's country
    tgt = TokenBatch(bad, lengths.clone(), clean.pad_id, clean.has_bos)
    positions = list(range(width - args.positions, width))
    readout = answer_logprob(model, ANSWERS[:k])
    ids = [list(s[0].ids) for s in readout.sets]
    dev = model.W_U.device

    def tl_metric(logits: torch.Tensor) -> torch.Tensor:
        lp = logits[:, -1].float().log_softmax(-1)
        return torch.stack([torch.logsumexp(lp[i, ids[i]], -1) for i in range(k)])

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    print(
        f"model {model.cfg.model_name}: {len(layers)} layers x {len(positions)} positions, "
        f"{k} pairs of {width} tokens, device {dev}"
    )
    patch_activations(
        model, src, tgt, "resid_pre", layers=layers[:1], positions=positions[:1], readout=readout
    )  # warm-up

    def ours(batching: str, reuse_prefix: bool | None = None):
        sync()
        t0 = time.perf_counter()
        sw = patch_activations(
            model,
            src,
            tgt,
            "resid_pre",
            layers=layers,
            positions=positions,
            readout=readout,
            cells_per_batch=args.cells_per_batch,
            batching=batching,
            reuse_prefix=reuse_prefix,
        )
        sync()
        return sw, time.perf_counter() - t0

    def best(*how, **kw):  # best of --repeats (the TransformerLens loop runs once: 72 passes)
        runs = [ours(*how, **kw) for _ in range(args.repeats)]
        return runs[0][0], min(t for _, t in runs)

    grown, t_grow = best("grow")
    every, t_every = best("grow", reuse_prefix=False)
    stacked, t_stack = best("stack")

    import transformer_lens.patching as tlp

    t0 = time.perf_counter()
    _, cache = model.run_with_cache(
        src.tokens.to(dev), names_filter=lambda n: n.endswith("resid_pre")
    )
    index = pd.DataFrame([(la, p) for la in layers for p in positions], columns=["layer", "pos"])
    ref = tlp.generic_activation_patch(
        model,
        tgt.tokens.to(dev),
        cache,
        tl_metric,
        tlp.layer_pos_patch_setter,
        "resid_pre",
        index_df=index,
        reduce="none",
    ).values
    sync()
    t_tl = time.perf_counter() - t0
    diff = max(
        float((sw.values[0].to(ref.device) - ref).abs().max()) for sw in (grown, every, stacked)
    )
    t_floor = floor(model, src, tgt, layers, positions)
    nn = peer_nnterp(args, src, tgt, layers, positions, ids, grown.values[0], k)
    print(f"mechlingo patching, default: {t_grow:8.2f} s ({len(grown.cells)} cells)")
    print(f"mechlingo, reuse_prefix=False: {t_every:8.2f} s")
    print(f"mechlingo, batching='stack': {t_stack:8.2f} s")
    print(f"TransformerLens per-cell: {t_tl:8.2f} s")
    print(
        f"speed-up: {t_tl / t_grow:.1f}x (default), {t_tl / t_every:.1f}x (no prefix reuse), "
        f"{t_tl / t_stack:.1f}x (stack)   max |difference|: {diff:.2e}"
    )
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.1f}")
    print()
    print(f"patching over the unavoidable work (floor): {t_grow / t_floor:.1f}x")
    print(f"prefix reuse vs every position (reuse_prefix=False): {t_every / t_grow:.1f}x")
    if nn is not None:
        print(f"patching vs nnterp (nnsight) per cell: {nn / t_grow:.1f}x")
    print(f"patching vs TransformerLens per cell: {t_tl / t_grow:.1f}x")


def _bare(model, batch: TokenBatch) -> float:
    """Seconds of one bare forward of ``batch`` to the final residual stream (one hook)."""
    from mechlingo.activations.runs import collect, final_resid_name

    t0 = time.perf_counter()
    collect(model, batch, [final_resid_name(model)])
    return time.perf_counter() - t0


def floor(
    model, src: TokenBatch, tgt: TokenBatch, layers: list[int], positions: list[int]
) -> float:
    """The work layer x position patching cannot avoid, timed here:

    * one pass of the source (its activations) and one of the target (the unpatched run,
      whose keys and values every patched copy shares before its position);
    * per cell (layer ``l``, position ``p``) and pair, the blocks from ``l`` on at positions
      ``p`` onwards: a full pass of ``pairs x positions`` rows, scaled by
      ``sum over cells of (n - l) / n * (T - p) / T`` over the number of positions;
    * the unembedding of every patched row at its last token (the readout is a
      log-probability, so the whole vocabulary is needed): one GEMM.
    """
    n = int(model.cfg.n_layers)
    width = src.tokens.shape[1]
    k = src.batch_size
    rows = TokenBatch(
        src.tokens.repeat(len(positions), 1),
        src.lengths.repeat(len(positions)),
        src.pad_id,
        src.has_bos,
    )
    _bare(model, rows)  # warm-up
    t_one = min(_bare(model, src) for _ in range(2))
    t_rows = min(_bare(model, rows) for _ in range(2))
    share = sum((n - la) / n * (width - p) / width for la in layers for p in positions)
    fwd = 2 * t_one + share / len(positions) * t_rows
    x = torch.randn(k * len(layers) * len(positions), int(model.cfg.d_model))
    W = model.W_U.detach().float()
    t0 = time.perf_counter()
    torch.logsumexp(x.to(W.device) @ W, dim=-1)
    t_gemm = time.perf_counter() - t0
    total = fwd + t_gemm
    print(
        f"floor: {total:.2f} s (forward {fwd:.2f} s: one pass {t_one:.3f} s, "
        f"{rows.batch_size} rows {t_rows:.3f} s; readout GEMM {t_gemm:.2f} s for "
        f"{x.shape[0]} rows)"
    )
    return total


def peer_nnterp(args, src, tgt, layers, positions, ids, ours, k) -> float | None:
    """nnterp (on nnsight) per cell: the layer input at (layer, position) of the corrupted run
    set to the clean run's, one trace per cell over all pairs; checked equal to mechlingo's
    values before its time is returned. ``None`` (and a line saying so) without nnterp."""
    if args.smoke:
        skipped("nnterp (its own environment)")
        return None
    try:
        from nnterp import StandardizedTransformer
    except ImportError as err:
        print(f"nnterp: not installed here ({err}); scripts/build_peer_envs.sh builds it")
        return None
    from mechlingo.core.models import ensure_default_model

    nn = StandardizedTransformer(
        args.model or str(ensure_default_model()), device_map="cpu", dtype=torch.float32
    )
    clean = {"input_ids": src.tokens, "attention_mask": torch.ones_like(src.tokens)}
    bad = {"input_ids": tgt.tokens, "attention_mask": torch.ones_like(tgt.tokens)}

    def run() -> torch.Tensor:
        # nnsight runs a trace's body in its own frame: results go through objects made
        # before the trace (a function's locals are not written back)
        acts: dict[int, torch.Tensor] = {}
        got: dict[str, torch.Tensor] = {}
        with torch.no_grad(), nn.trace(clean):
            for la in layers:
                acts[la] = nn.layers_input[la].save()
        out = torch.empty(len(layers), len(positions), k)
        for i, la in enumerate(layers):
            for j, p in enumerate(positions):
                with torch.no_grad(), nn.trace(bad):
                    nn.layers_input[la][:, p] = acts[la][:, p]
                    got["lg"] = nn.logits[:, -1].save()
                lp = got["lg"].float().log_softmax(-1)
                out[i, j] = torch.stack([torch.logsumexp(lp[r, ids[r]], -1) for r in range(k)])
        return out

    t0 = time.perf_counter()
    got = run()
    t_nn = time.perf_counter() - t0
    diff = float((got.flatten(0, 1) - ours.flatten(0, -2).cpu()).abs().max())
    print(f"nnterp per-cell: {t_nn:.2f} s; max |difference| vs mechlingo {diff:.2e}")
    if diff > 1e-3:
        raise SystemExit("nnterp and mechlingo disagree: not timed")
    return t_nn


if __name__ == "__main__":
    main()

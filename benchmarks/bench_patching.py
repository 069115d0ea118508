"""Benchmark: batched residual activation patching vs TransformerLens's per-cell patching.

Patches ``resid_pre`` over a (layers x positions) grid on the embedded model (or any model
given with ``--model``) two ways in one process, on the same clean/corrupted pair and grid:

* ``mechlingo.analyses.patching.patch_activations`` (default ``batching="grow"``): source
  activations read once; one pass per example in which the batch grows by each layer's
  patched copies at that layer's block input (the unpatched prefix is computed once); passes
  stop at the final residual stream and the last tokens of all rows are unembedded in one
  readout;
* the same with ``batching="stack"`` (every copy runs the whole model), for reference;
* ``transformer_lens.patching.get_act_patch_resid_pre``-style per-cell patching
  (``generic_activation_patch`` with ``layer_pos_patch_setter`` on the same grid): one full
  forward per cell, full logits.

Prints the times, the ratios to the TransformerLens loop and the largest |difference| of the
per-example metric.

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

from mechlingo.analyses.patching import answer_logprob, patch_activations  # noqa: E402
from mechlingo.core.models import load_model  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--layers", default=None, help="comma-separated layers (default all)")
    ap.add_argument("--positions", type=int, default=4, help="last N positions (default 4)")
    ap.add_argument("--pairs", type=int, default=4, help="clean/corrupted pairs (default 4)")
    ap.add_argument(
        "--cells-per-batch", type=int, default=None, help="default: patch_activations's"
    )
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    model = load_model(args.model, device=args.device)
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
    metric = answer_logprob(model, ANSWERS[:k])
    ids = [list(s[0].ids) for s in metric.sets]
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
        model, src, tgt, "resid_pre", layers=layers[:1], positions=positions[:1], metric=metric
    )  # warm-up

    def ours(batching: str):
        sync()
        t0 = time.perf_counter()
        sw = patch_activations(
            model,
            src,
            tgt,
            "resid_pre",
            layers=layers,
            positions=positions,
            metric=metric,
            cells_per_batch=args.cells_per_batch,
            batching=batching,
        )
        sync()
        return sw, time.perf_counter() - t0

    grown, t_grow = ours("grow")
    stacked, t_stack = ours("stack")

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
    diff = max(float((sw.values[0].to(ref.device) - ref).abs().max()) for sw in (grown, stacked))
    t_floor = floor(model, src, tgt, layers, len(positions))
    nn = peer_nnterp(args, src, tgt, layers, positions, ids, grown.values[0], k)
    print(f"mechlingo patching, grow : {t_grow:8.2f} s ({len(grown.cells)} cells)")
    print(f"mechlingo patching, stack: {t_stack:8.2f} s")
    print(f"TransformerLens per-cell: {t_tl:8.2f} s")
    print(
        f"speed-up: {t_tl / t_grow:.1f}x (grow, the default), {t_tl / t_stack:.1f}x (stack)   "
        f"max |difference|: {diff:.2e}"
    )
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.1f}")
    print()
    print(f"patching vs TransformerLens per cell: {t_tl / t_grow:.1f}x")
    if nn is not None:
        print(f"patching vs nnterp (nnsight) per cell: {nn / t_grow:.1f}x")
    print(f"patching over the unavoidable forward passes (floor): {t_grow / t_floor:.1f}x")


def _bare(model, batch: TokenBatch) -> float:
    """Seconds of one bare forward of ``batch`` to the final residual stream (one hook)."""
    from mechlingo.activations.runs import collect, final_resid_name

    t0 = time.perf_counter()
    collect(model, batch, [final_resid_name(model)])
    return time.perf_counter() - t0


def floor(model, src: TokenBatch, tgt: TokenBatch, layers: list[int], n_pos: int) -> float:
    """The forward passes layer x position patching cannot avoid, timed here: one pass of the
    source (its activations), one of the target (the unpatched prefix, shared by all
    cells), and for each layer ``l`` the blocks after ``l`` on the ``n_pos`` patched copies
    of every pair (measured as a full pass of ``k x n_pos`` rows times ``(n - l) / n``)."""
    n = int(model.cfg.n_layers)
    rows = TokenBatch(
        src.tokens.repeat(n_pos, 1), src.lengths.repeat(n_pos), src.pad_id, src.has_bos
    )
    _bare(model, rows)  # warm-up
    t_one = min(_bare(model, src) for _ in range(2))
    t_rows = min(_bare(model, rows) for _ in range(2))
    total = 2 * t_one + sum((n - la) / n for la in layers) * t_rows
    print(f"floor: {total:.2f} s (one pass {t_one:.3f} s, {rows.batch_size} rows {t_rows:.3f} s)")
    return total


def peer_nnterp(args, src, tgt, layers, positions, ids, ours, k) -> float | None:
    """nnterp (on nnsight) per cell: the layer input at (layer, position) of the corrupted run
    set to the clean run's, one trace per cell over all pairs; checked equal to mechlingo's
    values before its time is returned. ``None`` (and a line saying so) without nnterp."""
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

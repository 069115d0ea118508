"""Benchmark: a population of random-neuron clamps in one stacked pass, against one clamp and
against one run per clamp.

The claims card measures the expert clamp against a population of layer-matched random clamps
(the budget's ``experts.random_sets``: 5 quick, 20 full) on the same BOS samples, neutral
prompts and held-out lines (the k curve's arms, :func:`mechlingo.analyses.experts.k_curve`).
This prints the CPU seconds of one random clamp alone, of the ``m`` clamps run one by one,
and of the ``m`` clamps stacked in one batched pass; then ``bench_clamp_population_cost:
N.Nx``, the stacked population's cost in units of one clamp (``m`` would be one run per
draw), and, last, ``bench_clamp_population: N.Nx``: the speed-up of the stacked pass over
the clamps run one by one (the alternative). The card's quick sizes by default: 16 BOS samples of 12
new tokens, 4 held-out lines per language of at most 24 tokens, the bundled parallel
sentences, experts found on ``--n-find`` lines per language.

    python benchmarks/bench_clamp_population.py              # 5 draws (quick)
    python benchmarks/bench_clamp_population.py --draws 20   # full
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smoke import add_smoke_flag, apply_smoke, bench_model  # noqa: E402

from mechlingo.analyses.experts import find_experts  # noqa: E402
from mechlingo.analyses.experts.kcurve import _outputs_one, _outputs_stacked  # noqa: E402
from mechlingo.card.stages import CardSettings, budget_settings  # noqa: E402
from mechlingo.card.stages.data import parallel_parts  # noqa: E402

CLOCK = time.process_time  # CPU seconds of this process (one thread: the work done)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--draws", type=int, default=5, help="random clamps (default 5, quick)")
    ap.add_argument("--k", type=int, default=50, help="neurons per clamp (default 50)")
    ap.add_argument("--n-find", type=int, default=8, help="lines per language finding experts")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--lines", type=int, default=4, help="held-out lines per language")
    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, {"draws": 2, "k": 4, "n_find": 2, "samples": 2, "new_tokens": 2, "lines": 1})
    torch.set_grad_enabled(False)
    model = bench_model(args)
    cfg = budget_settings("quick")
    texts = parallel_parts(None, CardSettings.of(cfg), None)
    find = {lg: v[: args.n_find] for lg, v in texts["find"].items()}
    res = find_experts(model, find, max_tokens=24, batch_size=16)
    lines = {lg: v[: args.lines] for lg, v in texts["eval"].items()}
    clamps = [res.random_clamp("es", args.k, seed=s, layer_matched=True)
              for s in range(args.draws)]  # fmt: skip
    opts = {"n_samples": args.samples, "max_new_tokens": args.new_tokens,
            "prompts": ("1.", "*", "Text:", '"'), "seed": 1, "max_tokens": 24}  # fmt: skip
    _outputs_one(model, clamps[0], {"es": lines["es"][:1]}, **{**opts, "n_samples": 2})  # warm
    t0 = CLOCK()
    _outputs_one(model, clamps[0], lines, **opts)
    one = CLOCK() - t0
    t0 = CLOCK()
    alone = [_outputs_one(model, c, lines, **opts) for c in clamps]
    each = CLOCK() - t0
    t0 = CLOCK()
    stacked = _outputs_stacked(model, clamps, lines, **opts)
    pop = CLOCK() - t0
    same = all(a["bos"] == b["bos"] and a["prompt"] == b["prompt"] for a, b in
               zip(alone, stacked, strict=True))  # fmt: skip
    gap = max(float((a["nll"][lg][0] - b["nll"][lg][0]).abs().max())
              for a, b in zip(alone, stacked, strict=True) for lg in lines)  # fmt: skip
    print(f"model {model.cfg.model_name}: {args.draws} random clamps of k = {args.k}; "
          f"{args.samples} BOS samples x {args.new_tokens} tokens, 4 prompts, "
          f"{sum(len(v) for v in lines.values())} held-out lines; "
          f"{torch.get_num_threads()} thread(s)")  # fmt: skip
    print(f"one clamp: {one:.1f} CPU-s; {args.draws} clamps one by one: {each:.1f} CPU-s "
          f"({each / one:.1f}x); stacked in one pass: {pop:.1f} CPU-s; same samples: {same}; "
          f"largest per-line NLL gap {gap:.1e}")  # fmt: skip
    if not same or gap > 1e-4:
        raise SystemExit("the stacked clamps and the clamps one by one differ")
    print(f"bench_clamp_population_cost: {pop / one:.1f}x   (one clamp = 1; {args.draws} would "
          "be one run per draw)")  # fmt: skip
    print(f"bench_clamp_population: {each / pop:.1f}x")


if __name__ == "__main__":
    main()

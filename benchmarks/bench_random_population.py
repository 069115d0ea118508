"""Benchmark: a population of norm-matched random vectors against one condition.

The claims card judges each repair vector against a population of random directions (the
budget's ``repair.seeds``: 5 quick, 20 full), scored as stacked conditions of one
:func:`~mechlingo.scoring.evaluate.evaluate_conditions` call on the test items. This prints
the CPU seconds of one random condition alone, of the ``m`` conditions one call each, and of
the whole population in one call; then ``bench_random_population_cost: N.Nx``, the
population's cost in units of one condition (``m`` would be one run per draw), and, last,
``bench_random_population: N.Nx``: the speed-up of the one call over one call per draw (the
alternative; their records are checked equal). Random directions at the
card's steering layer, scaled to the mean last-token residual norm there (the cost does not
depend on the direction); facts are the bundled capital stems, with candidates under
``rank`` (the card's metric on the embedded model).

    python benchmarks/bench_random_population.py                  # rank, 5 draws, 16 x 6 facts
    python benchmarks/bench_random_population.py --metric generate --draws 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smoke import add_smoke_flag, apply_smoke, bench_model  # noqa: E402

from mechlingo.core.sites import layers_at  # noqa: E402
from mechlingo.core.tokens import encode  # noqa: E402
from mechlingo.data import load_facts  # noqa: E402
from mechlingo.data.candidates import with_candidates  # noqa: E402
from mechlingo.interventions import SteeringVector  # noqa: E402
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_conditions  # noqa: E402

CLOCK = time.process_time  # CPU seconds of this process (one thread: the work done)


def population(model, facts, layer: int, m: int, alpha: float) -> dict[str, SteeringVector]:
    """``m`` random unit directions at ``layer`` scaled to the mean last-token resid norm."""
    b = encode(model, [f.prompt for f in facts[:32]])
    name = f"blocks.{layer}.hook_resid_pre"
    _, cache = model.run_with_cache(b.tokens, attention_mask=b.attention_mask(),
                                    names_filter=lambda n: n == name)  # fmt: skip
    norm = cache[name][torch.arange(b.batch_size), b.lengths - 1].norm(dim=-1).mean()
    n_layers, d = int(model.cfg.n_layers), int(model.cfg.d_model)
    out = {}
    for s in range(m):
        v = torch.zeros(n_layers, d)
        g = torch.randn(d, generator=torch.Generator().manual_seed(s))
        v[layer] = g / g.norm() * norm
        out[f"random_s{s}"] = SteeringVector(v).at(layer, alpha)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--metric", default="rank", choices=["rank", "generate"])
    ap.add_argument("--draws", type=int, default=5, help="random vectors (default 5, quick)")
    ap.add_argument("--facts", type=int, default=16, help="facts per language (default 16)")
    ap.add_argument("--langs", default="en,fr,es,ru,ja,hi")
    ap.add_argument("--batch-size", type=int, default=16)
    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, {"draws": 2, "facts": 4, "langs": "en,fr", "batch_size": 4})
    torch.set_grad_enabled(False)
    model = bench_model(args)
    facts = load_facts(langs=args.langs.split(","), relations=["capital"], limit=args.facts)
    if args.metric == "rank":
        facts = with_candidates(facts, 4)
    layer = layers_at([0.5], int(model.cfg.n_layers))[0]
    conds = population(model, facts, layer, args.draws, 0.28)
    kw = {
        "metric": args.metric,
        "decoding": DecodeOptions(max_new_tokens=6, batch_size=args.batch_size),
    }
    evaluate_conditions(model, facts[:4], {"warm": conds["random_s0"]}, **kw)
    t0 = CLOCK()
    evaluate_conditions(model, facts, {"random_s0": conds["random_s0"]}, **kw)
    one = CLOCK() - t0
    t0 = CLOCK()
    alone = {c: evaluate_conditions(model, facts, {c: v}, **kw)[c] for c, v in conds.items()}
    each = CLOCK() - t0
    t0 = CLOCK()
    res = evaluate_conditions(model, facts, conds, **kw)
    pop = CLOCK() - t0
    same = all(res[c].records == alone[c].records for c in conds)
    path = next(iter(res.values())).meta.get("path")
    print(f"model {model.cfg.model_name}, metric {args.metric}: {len(facts)} items; layer "
          f"{layer}; {torch.get_num_threads()} thread(s); path {path}")  # fmt: skip
    print(f"one condition: {one:.1f} CPU-s; {args.draws} draws one call each: {each:.1f} CPU-s; "
          f"{args.draws} draws in one call: {pop:.1f} CPU-s ({pop / args.draws:.2f} per draw); "
          f"records equal: {same}")  # fmt: skip
    if not same:
        raise SystemExit("the population in one call and one call per draw differ")
    print(f"bench_random_population_cost: {pop / one:.1f}x   (one condition = 1; {args.draws} "
          "would be one run per draw)")  # fmt: skip
    print(f"bench_random_population: {each / pop:.1f}x")


if __name__ == "__main__":
    main()

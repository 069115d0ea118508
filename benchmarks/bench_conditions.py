"""Benchmark: the dev sweep's conditions scored together on shared prefixes vs one at a time.

The conditions are those of ``steer eval``'s default screen (:func:`mechlingo.core.sites.every_second_layer` x
:data:`~mechlingo.analyses.recall.settings.ALPHA_GRID` for the two
vectors, plus no intervention), steering at ``positions="last"`` with vectors of the
protocol's ``resid`` unit (each layer's direction scaled to the mean last-token residual norm
there; random directions stand in for built vectors: the cost does not depend on the
direction). Scored on ``--facts`` facts per language with the eval rule, three ways in one
process:

* **one at a time**: :func:`~mechlingo.scoring.evaluate.evaluate_facts` per condition (the
  path every condition took before shared prefixes);
* **shared prefix**: :func:`~mechlingo.scoring.evaluate.evaluate_conditions` (each batch's
  prompt positions before the last run once; the conditions decode from that cache, stacked);
* **floor**: the same prefix passes once plus the same stacked decoding with no hook at all
  (no intervention's edit, no row routing): what sharing the prefix cannot go below.

The per-item records of the two paths are checked equal. Prints the times and, last, the
speed-up ``bench_conditions: N.Nx`` (one at a time / shared), all in CPU seconds of the
process (``time.process_time``: with one thread, the work done, whatever else runs on the
machine) and ``bench_conditions_floor:
N.Nx`` (shared / floor).

    python benchmarks/bench_conditions.py                         # 64 facts x 6 languages, 71 conditions
    python benchmarks/bench_conditions.py --conditions 15         # an even subset of the grid
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smoke import add_smoke_flag, apply_smoke, bench_model  # noqa: E402

from mechlingo.activations.prefix import decode_conditions, record_head  # noqa: E402
from mechlingo.analyses.recall.settings import ALPHA_GRID  # noqa: E402
from mechlingo.core.answers import decided  # noqa: E402
from mechlingo.core.sites import every_second_layer  # noqa: E402
from mechlingo.core.tokens import encode, sorted_batches  # noqa: E402
from mechlingo.data import load_facts  # noqa: E402
from mechlingo.interventions import SteeringVector  # noqa: E402
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_conditions, evaluate_facts  # noqa: E402

# CPU seconds of this process on a CPU (one thread: the work done, however busy the machine
# is); set to wall seconds when the model is on a GPU
CLOCK = time.process_time


def resid_norms(model, prompts: list[str]) -> torch.Tensor:
    """Mean last-token norm of ``resid_pre`` at every layer (the ``resid`` unit)."""
    b = encode(model, prompts)
    names = [f"blocks.{i}.hook_resid_pre" for i in range(int(model.cfg.n_layers))]
    _, cache = model.run_with_cache(b.tokens, attention_mask=b.attention_mask(),
                                    names_filter=lambda n: n in names)  # fmt: skip
    rows = torch.arange(b.batch_size)
    return torch.stack([cache[n][rows, b.lengths - 1].norm(dim=-1).mean() for n in names])


def stacks(model, norms: torch.Tensor) -> dict[str, SteeringVector]:
    d = int(model.cfg.d_model)
    out = {}
    for seed, name in enumerate(("task", "diff")):
        g = torch.Generator().manual_seed(seed)
        v = torch.randn(len(norms), d, generator=g)
        out[name] = SteeringVector(v / v.norm(dim=-1, keepdim=True) * norms[:, None])
    return out


def conditions(model, norms: torch.Tensor, n: int | None) -> dict[str, SteeringVector | None]:
    grid = [(name, layer, alpha) for name in ("task", "diff")
            for layer in every_second_layer(int(model.cfg.n_layers)) for alpha in ALPHA_GRID]  # fmt: skip
    if n is not None and n < len(grid):
        grid = [grid[round(i * (len(grid) - 1) / max(1, n - 1))] for i in range(n)]
    st = stacks(model, norms)
    conds: dict[str, SteeringVector | None] = {"orig": None}
    for name, layer, alpha in grid:
        conds[f"{name}:{layer}:{alpha}"] = st[name].at(layer, alpha)
    return conds


def floor(model, facts, k: int, batch_size: int, max_new_tokens: int, max_rows: int) -> float:
    """The prefix passes once per batch plus ``k`` conditions' stacked decoding with no hooks
    (rows stop by the same rule: a line break or a final verdict)."""
    batch = encode(model, [f.prompt for f in facts])
    eos = getattr(model.tokenizer, "eos_token_id", None)
    t0 = CLOCK()
    for rows in sorted_batches(batch.lengths, batch_size):
        sub = batch.select(rows)
        rec = record_head(model, sub, 1)
        per = max(1, max_rows // sub.batch_size)

        def stop(c, r, ids, rows=rows):
            text, f = model.tokenizer.decode(ids), facts[rows[r]]
            newline = "\n" in text and bool(text.strip())
            return newline or decided(text, f.answers, f.lang, f.answer_en)

        for i in range(0, k, per):
            n = min(per, k - i)
            decode_conditions(model, sub, [[]] * n, 1, max_new_tokens=max_new_tokens,
                              record=rec, stop=stop, eos=eos)  # fmt: skip
    return CLOCK() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--langs", default="en,de,fr,es,ja,zh")
    ap.add_argument("--facts", type=int, default=64, help="facts per language (default 64)")
    ap.add_argument("--conditions", type=int, default=None,
                    help="an even subset of the grid's settings (default: all of them)")  # fmt: skip
    ap.add_argument("--batch-size", type=int, default=64, help="as steer eval (default 64)")
    ap.add_argument("--max-new-tokens", type=int, default=6, help="as steer eval (default 6)")
    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, {"langs": "en,fr", "facts": 2, "conditions": 3, "batch_size": 4,
                       "max_new_tokens": 2})  # fmt: skip
    torch.set_grad_enabled(False)
    model = bench_model(args, device=args.device)
    global CLOCK
    if model.W_U.device.type != "cpu":
        CLOCK = time.perf_counter
    langs = args.langs.split(",")
    per_rel = -(-args.facts // 6)
    facts = []
    for lg in langs:
        facts += load_facts(langs=[lg], limit=per_rel)[: args.facts]
    norms = resid_norms(model, [f.prompt for f in facts[:32]])
    conds = conditions(model, norms, args.conditions)
    kw = {"decoding": DecodeOptions(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)}
    print(f"model {model.cfg.model_name}: {len(conds)} conditions x {len(facts)} facts "
          f"({args.facts} x {len(langs)} languages), batch {args.batch_size}, "
          f"{args.max_new_tokens} new tokens, {torch.get_num_threads()} thread(s)")  # fmt: skip
    evaluate_facts(model, facts[:4], **kw)  # warm-up (probes, screens)
    evaluate_conditions(model, facts[:4], dict(list(conds.items())[:3]), **kw)

    t0, w0 = CLOCK(), time.perf_counter()
    shared = evaluate_conditions(model, facts, conds, **kw)
    t_shared, w_shared = CLOCK() - t0, time.perf_counter() - w0
    path = {r.meta["path"] for r in shared.values()}
    t0, w0 = CLOCK(), time.perf_counter()
    alone = {
        name: evaluate_facts(model, facts, intervention=iv, **kw) for name, iv in conds.items()
    }
    t_alone, w_alone = CLOCK() - t0, time.perf_counter() - w0
    same = all(shared[n].records == alone[n].records for n in conds)
    t_floor = floor(model, facts, len(conds), args.batch_size, args.max_new_tokens,
                    max(args.batch_size, 256))  # fmt: skip
    n = len(conds) * len(facts)
    print("CPU seconds of this process (wall seconds in brackets; the machine may be shared)")
    print(f"one condition at a time : {t_alone:8.2f} s ({1e3 * t_alone / n:.2f} ms per item) "
          f"[{w_alone:.1f}]")  # fmt: skip
    print(f"shared prefix ({'/'.join(path)}): {t_shared:8.2f} s "
          f"({1e3 * t_shared / n:.2f} ms per item) [{w_shared:.1f}]")  # fmt: skip
    print(f"floor (prefix once + bare stacked decoding): {t_floor:8.2f} s")
    print(f"records equal: {same}")
    if not same:
        raise SystemExit("the shared-prefix records differ from one condition at a time")
    print(f"bench_conditions_floor: {t_shared / t_floor:.1f}x")
    print(f"bench_conditions: {t_alone / t_shared:.1f}x")


if __name__ == "__main__":
    main()

"""Benchmark: attribution patching (AtP) against exact activation patching on the same grid.

On the embedded model (or ``--model``), the tracer's corrupted-subject setup: ``--pairs``
clean facts of one language (``--lang``) and, as corrupted runs, facts of the same template
with another subject; positions aligned by subject span and from the end (subject first and
last token, the last two prompt tokens); the clean answer's log-probability is the metric.
Grid: every layer x those 4 positions x (``attn_out``, ``mlp_out``, every head), plus
``resid_pre`` for the QK fix. Each grid is measured two ways in one process:

* exact: :func:`mechlingo.analyses.patching.patch_activations` (``batching="grow"``);
* AtP: :func:`mechlingo.analyses.attribution.attribution_patch` (one forward + one backward pass per
  metric; ``resid_pre`` with and without AtP*'s QK fix).

Prints, per site type, the Spearman rank correlation and top-10 agreement of the per-cell
effects, then the time ratios (exact / AtP) as ``name: N.Nx`` lines.

    python benchmarks/bench_attribution.py                 # 18 layers x 4 positions x 4 heads
    python benchmarks/bench_attribution.py --lang en --pairs 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mechlingo.analyses.attribution import attribution_patch, compare_patching  # noqa: E402
from mechlingo.analyses.patching import fact_metrics, patch_activations  # noqa: E402
from mechlingo.core.models import load_model  # noqa: E402
from mechlingo.data import load_facts  # noqa: E402

POSITIONS: list[int | str] = ["subject_first", "subject_last", -2, -1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--lang", default="fr", help="language of the facts (default fr)")
    ap.add_argument("--pairs", type=int, default=4, help="clean/corrupted pairs (default 4)")
    ap.add_argument("--repeats", type=int, default=3, help="AtP timing: best of N (default 3)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    model = load_model(args.model, device=args.device)
    facts = load_facts(langs=[args.lang], relations=["capital"])
    k = args.pairs
    clean = facts[:k]
    corrupt = [facts[(i + 7) % len(facts)] for i in range(k)]  # another subject, same template
    # one metric, the clean answer's log-probability (AtP needs one backward pass per metric;
    # exact patching reads any number of metrics from the same passes)
    metric = fact_metrics(model, clean)[0]
    kw = {"positions": POSITIONS, "metric": metric, "alignment": "subject"}
    dev = model.W_U.device

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn, repeats: int = 1):
        best, out = float("inf"), None
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            out = fn()
            sync()
            best = min(best, time.perf_counter() - t0)
        return out, best

    n = int(model.cfg.n_layers)
    print(
        f"model {model.cfg.model_name}: {n} layers x {len(POSITIONS)} positions x "
        f"{int(model.cfg.n_heads)} heads, {k} {args.lang} pairs, device {dev}"
    )
    for f, g in zip(clean, corrupt, strict=True):
        print(f"  clean {f.prompt!r} -> {f.answer!r}; corrupted {g.prompt!r}")
    # warm-up (first calls build caches)
    attribution_patch(model, clean[:1], corrupt[:1], "mlp_out", layers=[0], **_one(kw))
    patch_activations(model, clean[:1], corrupt[:1], "mlp_out", layers=[0], **_one(kw))

    grids = {
        "attn_out+mlp_out": ["attn_out", "mlp_out"],
        "heads": ["head"],
        "resid_pre": ["resid_pre"],
    }
    exact, t_exact = {}, {}
    for name, sites in grids.items():
        exact[name], t_exact[name] = timed(
            lambda s=sites: patch_activations(model, clean, corrupt, s, **kw)
        )
        print(f"exact {name}: {len(exact[name].cells)} cells, {t_exact[name]:.2f} s")
    atp, t_atp = {}, {}
    for name, sites in grids.items():
        atp[name], t_atp[name] = timed(
            lambda s=sites: attribution_patch(model, clean, corrupt, s, qk_fix=False, **kw),
            args.repeats,
        )
        print(f"AtP   {name}: {t_atp[name]:.3f} s")
    star, t_star = timed(
        lambda: attribution_patch(model, clean, corrupt, "resid_pre", qk_fix=True, **kw),
        args.repeats,
    )
    print(f"AtP*  resid_pre (QK fix): {t_star:.3f} s")
    all_sites = ["attn_out", "mlp_out", "head"]
    _, t_all = timed(
        lambda: attribution_patch(model, clean, corrupt, all_sites, **kw), args.repeats
    )
    print(f"AtP   attn_out+mlp_out+heads in one pass: {t_all:.3f} s")

    print("\nrank agreement with exact patching (per-cell effect on the answer log-prob):")
    rows = [
        ("attn_out", compare_patching(atp["attn_out+mlp_out"], exact["attn_out+mlp_out"])),
        ("mlp_out", compare_patching(atp["attn_out+mlp_out"], exact["attn_out+mlp_out"])),
        ("head", compare_patching(atp["heads"], exact["heads"])),
        ("resid_pre", compare_patching(atp["resid_pre"], exact["resid_pre"])),
    ]
    for site, cmp in rows:
        c = cmp[site]
        print(
            f"  {site:10s} spearman {c['spearman']:.3f}  pearson {c['pearson']:.3f}  "
            f"top-{c['k']} {c['top_k']:.2f}  ({c['n_cells']} cells)"
        )
    c = compare_patching(star, exact["resid_pre"])["resid_pre"]
    print(
        f"  resid_pre with the QK fix: spearman {c['spearman']:.3f}  pearson "
        f"{c['pearson']:.3f}  top-{c['k']} {c['top_k']:.2f}"
    )
    print()
    t_ex_all = t_exact["attn_out+mlp_out"] + t_exact["heads"]
    print(
        f"AtP vs exact (attn_out+mlp_out): {t_exact['attn_out+mlp_out'] / t_atp['attn_out+mlp_out']:.1f}x"
    )
    print(f"AtP vs exact (heads): {t_exact['heads'] / t_atp['heads']:.1f}x")
    print(f"AtP vs exact (attn_out+mlp_out+heads): {t_ex_all / t_all:.1f}x")
    print(f"AtP* vs exact (resid_pre, QK fix): {t_exact['resid_pre'] / t_star:.1f}x")


def _one(kw: dict) -> dict:
    """The sweep arguments for the first pair only (warm-up)."""
    m = kw["metric"]
    return {**kw, "metric": m.__class__(m.name, m.kind, m.sets[:1])}


if __name__ == "__main__":
    main()

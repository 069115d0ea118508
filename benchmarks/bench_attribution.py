"""Benchmark: attribution patching (AtP, and integrated gradients) against exact activation
patching on the same grid, in the same run.

On the embedded model (or ``--model``), the tracer's corrupted-subject setup: ``--pairs``
clean facts of one language (``--lang``, capital relation) and, as corrupted runs, facts of
the same template with another subject; positions aligned by subject span and from the end
(subject first and last token, the last two prompt tokens); the clean answer's log-probability
is the readout. Grid: every layer x those 4 positions x (``attn_out``, ``mlp_out``, every
head), plus ``resid_pre`` for the QK fix. Each grid is measured in one process:

* exact: :func:`mechlingo.analyses.recall.patching.patch_activations` (``batching="grow"``), the reference;
* AtP: :func:`mechlingo.analyses.recall.attribution.attribution_patch` (one forward + one backward
  pass; ``resid_pre`` with and without AtP*'s QK fix);
* IG: the same with ``method="ig"`` (``--steps``: the target runs once per interpolation step,
  all steps in one forward + one backward pass).

Dev and held-out prompts: the facts are split by index parity (``--split dev``: even,
``test``: odd, the default); ``--pairing same`` (default) pairs each clean fact with the next
fact of the same token length (integrated gradients interpolate the input embeddings position
by position), ``--pairing any`` with any other subject (AtP only). The default number of IG
steps was chosen with ``--split dev --steps 1,2,4,8`` and is reported on ``--split test``.

Prints, per site and method, the Spearman rank correlation of the per-cell mean effects with a
95% percentile-bootstrap interval over prompt pairs (n = cells, pairs), then time ratios
(exact / method, and method / floor: the source forward plus the target forward and backward
passes, without hooks, that any gradient method needs) as ``name: N.Nx`` lines: the floors
first, then each method's speed-up over exact patching, AtP's last.

    nice -n 19 env OMP_NUM_THREADS=1 python benchmarks/bench_attribution.py
    python benchmarks/bench_attribution.py --split dev --steps 1,2,4,8
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import rankdata

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smoke import add_smoke_flag, apply_smoke, bench_model  # noqa: E402

from mechlingo.activations.runs import StopForward, final_resid_name, hooked  # noqa: E402
from mechlingo.analyses.recall.attribution import IG_STEPS, attribution_patch  # noqa: E402
from mechlingo.analyses.recall.patching import fact_readouts, patch_activations  # noqa: E402
from mechlingo.analyses.recall.patching.grid import resolve_grid  # noqa: E402
from mechlingo.analyses.recall.patching.runs import read_run, repeat_batch  # noqa: E402
from mechlingo.core.tokens import batch_context  # noqa: E402
from mechlingo.data import load_facts  # noqa: E402
from mechlingo.kernels.readout import apply_final_norm, unembed  # noqa: E402
from mechlingo.kernels.significance import Interval  # noqa: E402

POSITIONS: list[int | str] = ["subject_first", "subject_last", -2, -1]
GRIDS = {"attn_out+mlp_out": ["attn_out", "mlp_out"], "heads": ["head"], "resid_pre": ["resid_pre"]}


def make_pairs(model, lang: str, split: str, k: int, pairing: str):
    """``k`` (clean, corrupted) fact pairs of one split: the corrupted fact is the next one
    (stepping by 7) of the same split with the same prompt token length (``same``) or any."""
    facts = load_facts(langs=[lang], relations=["capital"])[(0 if split == "dev" else 1) :: 2]
    n_tok = [int(model.to_tokens(f.prompt).shape[1]) for f in facts]
    clean, corrupt, used = [], [], set()
    for i, f in enumerate(facts):
        for d in range(1, len(facts)):
            j = (i + 7 * d) % len(facts)
            if j not in used and j != i and (pairing == "any" or n_tok[j] == n_tok[i]):
                clean.append(f)
                corrupt.append(facts[j])
                used |= {i, j}
                break
        if len(clean) == k:
            break
    return clean, corrupt


def spearman_ci(approx, exact, site: str, n_boot: int = 2000, seed: int = 0) -> Interval:
    """Spearman correlation of the per-cell mean effects of ``site`` (estimate vs exact),
    with a 95% percentile bootstrap over prompt pairs (both sweeps resampled together)."""
    idx = [i for i, c in enumerate(exact.cells) if c.site == site]
    where = {c: i for i, c in enumerate(approx.cells)}
    a = (approx.values[0] - approx.corrupted[0][None])[[where[exact.cells[i]] for i in idx]]
    e = (exact.values[0] - exact.corrupted[0][None])[idx]
    a, e = a.double().numpy(), e.double().numpy()  # [cell, pair]

    def rho(x: np.ndarray, y: np.ndarray) -> np.ndarray:  # [boot, cell] -> [boot]
        rx, ry = rankdata(x, axis=-1), rankdata(y, axis=-1)
        rx, ry = rx - rx.mean(-1, keepdims=True), ry - ry.mean(-1, keepdims=True)
        den = np.sqrt((rx**2).sum(-1) * (ry**2).sum(-1))
        return np.where(den > 0, (rx * ry).sum(-1) / np.where(den > 0, den, 1), np.nan)

    est = float(rho(a.mean(1)[None], e.mean(1)[None])[0])
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, a.shape[1], size=(n_boot, a.shape[1]))
    boot = rho(a[:, pick].mean(-1).T, e[:, pick].mean(-1).T)
    lo, hi = np.nanpercentile(boot, [2.5, 97.5])
    return Interval(est, float(lo), float(hi), len(idx))


def floor_pass(model, setup_src, setup_tgt, steps: int) -> None:
    """The passes a gradient method cannot avoid: the source forward to the final residual
    with its readout, and ``steps`` copies of the target forward and backward (gradient at the
    embeddings, no hooks but the one that reads the final residual)."""
    read_run(model, setup_src, {})
    big = repeat_batch(setup_tgt, steps) if steps > 1 else setup_tgt
    out = {}
    rows = torch.arange(big.batch_size)

    def embed(t, hook):
        out["x"] = t.detach().requires_grad_(True)
        return out["x"]

    def final(t, hook):
        out["f"] = t[rows, big.last_index]
        raise StopForward

    with torch.enable_grad(), batch_context(big):
        with hooked(model, [("hook_embed", embed), (final_resid_name(model), final)]):
            try:
                model(big.tokens, attention_mask=big.attention_mask())
            except StopForward:
                pass
        logits = unembed(model, apply_final_norm(model, out["f"]))
        torch.autograd.grad(logits.log_softmax(-1)[:, 0].sum(), out["x"])


def timed(fn, repeats: int = 1):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--lang", default="fr", help="language of the facts (default fr)")
    ap.add_argument("--pairs", type=int, default=4, help="clean/corrupted pairs (default 4)")
    ap.add_argument("--split", choices=["dev", "test"], default="test")
    ap.add_argument("--pairing", choices=["same", "any"], default="same")
    ap.add_argument("--steps", default=str(IG_STEPS), help="IG steps, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="AtP/IG timing: best of N")
    ap.add_argument("--grids", default=",".join(GRIDS), help="grids to run, comma-separated")
    add_smoke_flag(ap)
    args = apply_smoke(ap.parse_args(argv), {"pairs": 2, "steps": "2", "repeats": 1})
    torch.set_grad_enabled(False)
    grids = {g: GRIDS[g] for g in args.grids.split(",")}
    model = bench_model(args, device=args.device)
    clean, corrupt = make_pairs(model, args.lang, args.split, args.pairs, args.pairing)
    k = len(clean)
    readout = fact_readouts(model, clean)[0]
    kw = {"positions": POSITIONS, "readout": readout, "alignment": "subject"}
    n = int(model.cfg.n_layers)
    load = os.getloadavg()
    print(
        f"model {model.cfg.model_name}: {n} layers x {len(POSITIONS)} positions x "
        f"{int(model.cfg.n_heads)} heads, {k} {args.lang} pairs ({args.split} split, "
        f"{args.pairing}-length pairing), device {model.W_U.device}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for f, g in zip(clean, corrupt, strict=True):
        print(f"  clean {f.prompt!r} -> {f.answer!r}; corrupted {g.prompt!r}")
    steps = [int(s) for s in args.steps.split(",")] if args.pairing == "same" else []
    # warm-up (first calls build caches)
    attribution_patch(model, clean[:1], corrupt[:1], "mlp_out", layers=[0], **_one(kw))
    patch_activations(model, clean[:1], corrupt[:1], "mlp_out", layers=[0], **_one(kw))

    exact, t_exact = {}, {}
    for name, sites in grids.items():
        exact[name], t_exact[name] = timed(
            lambda s=sites: patch_activations(model, clean, corrupt, s, **kw)
        )
        print(f"exact {name}: {len(exact[name].cells)} cells, {t_exact[name]:.2f} s")
    methods = {"atp": {"method": "atp", "qk_fix": False}}
    methods |= {f"ig{s}": {"method": "ig", "steps": s} for s in steps}
    est, t_est = {}, {}
    for m, mkw in methods.items():
        for name, sites in grids.items():
            est[m, name], t_est[m, name] = timed(
                lambda s=sites, mk=mkw: attribution_patch(model, clean, corrupt, s, **mk, **kw),
                args.repeats,
            )
        print(f"{m:5s} " + ", ".join(f"{g} {t_est[m, g]:.3f} s" for g in grids))
    full = len(grids) == len(GRIDS)
    if full:
        est["atp*", "resid_pre"], t_est["atp*", "resid_pre"] = timed(
            lambda: attribution_patch(model, clean, corrupt, "resid_pre", qk_fix=True, **kw),
            args.repeats,
        )
        for m, mkw in methods.items():
            _, t_est[m, "all"] = timed(
                lambda mk=mkw: attribution_patch(
                    model, clean, corrupt, ["attn_out", "mlp_out", "head"], **mk, **kw
                ),
                args.repeats,
            )
        t_exact["all"] = t_exact["attn_out+mlp_out"] + t_exact["heads"]
    setup = resolve_grid(
        model, clean, corrupt, [], positions=POSITIONS, readout=readout, alignment="subject"
    )
    for m, mkw in methods.items():
        t_est[m, "floor"] = timed(
            lambda mk=mkw: floor_pass(model, setup.src, setup.tgt, mk.get("steps", 1)),
            args.repeats,
        )[1]
    _report(est, exact, t_est, t_exact, list(methods), grids, k)


def _report(est, exact, t_est, t_exact, methods, grids, k) -> None:
    """The Spearman lines and the time ratios (last lines)."""
    print("\nrank agreement with exact patching (per-cell mean effect on the answer log-prob),")
    print(f"95% bootstrap over the {k} pairs:")
    rows = [("attn_out", "attn_out+mlp_out"), ("mlp_out", "attn_out+mlp_out")]
    rows += [("head", "heads"), ("resid_pre", "resid_pre")]
    for m in [*methods, "atp*"]:
        for site, grid in rows:
            if (m, grid) in est:
                c = spearman_ci(est[m, grid], exact[grid], site)
                print(
                    f"spearman {site} ({m}): {c.estimate:.3f} [{c.lo:.3f}, {c.hi:.3f}], "
                    f"n={c.n} cells x {k} pairs"
                )
    print()
    names = {**{g: g for g in grids}, "all": "attn_out+mlp_out+heads in one pass"}
    for m in [*methods, "atp*"]:  # the floors first
        if (m, "floor") in t_est:
            f = t_est[m, "floor"]
            for g, label in names.items():
                if (m, g) in t_est:
                    print(f"{m} over its floor ({label}): {t_est[m, g] / f:.1f}x")
            for g, label in names.items():
                if g in t_exact and g in ("attn_out+mlp_out", "all"):
                    print(
                        f"exact over {m}'s floor ({label}, the most it can gain): "
                        f"{t_exact[g] / f:.1f}x"
                    )
    # last, the speed-ups over exact patching (AtP's last of all)
    for m in ["atp*", *[m for m in methods if m != "atp"], "atp"]:
        for g, label in names.items():
            if (m, g) in t_est and g in t_exact:
                print(f"{m} vs exact ({label}): {t_exact[g] / t_est[m, g]:.1f}x")


def _one(kw: dict) -> dict:
    """The sweep arguments for the first pair only (warm-up)."""
    m = kw["readout"]
    return {**kw, "readout": m.__class__(m.name, m.kind, m.sets[:1])}


if __name__ == "__main__":
    main()

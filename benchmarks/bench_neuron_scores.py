"""Benchmark: AUROC and average precision for every neuron at once vs a scikit-learn loop.

Scores ``--n-features`` features (default 36,864 = 18 layers x 2,048 MLP neurons, the
embedded Gemma-3-270M) over ``--n-samples`` sentences (default 2,000) with a positive rate of
1/12 (one target language among twelve), two ways in one process:

* the batched kernel ``mechlingo.kernels.ranking.auroc_and_average_precision`` (and the two
  single-metric calls);
* the obvious alternative: ``sklearn.metrics.roc_auc_score`` and ``average_precision_score``
  once per feature. The loop is timed on a random subset of ``--sklearn-features`` features
  and extrapolated linearly to all features (each call is independent, so the cost is linear);
  the output says so.

and the machine's floor for the same work, in the same run: one sort of the same array
(``numpy.sort`` of every feature's samples on CPU, ``torch.sort`` on CUDA).

Prints the times, the ratio, the largest |difference| on the compared features and the peak
extra memory of the kernel (CUDA: ``torch.cuda.max_memory_allocated`` above the input;
CPU: growth of the process's peak resident set size, measured before scikit-learn runs).

    python benchmarks/bench_neuron_scores.py                 # CPU, or CUDA when available
    python benchmarks/bench_neuron_scores.py --device cpu --n-features 4096
    OMP_NUM_THREADS=1 python benchmarks/bench_neuron_scores.py --device cpu --clock cpu

``--clock cpu`` times CPU seconds of the process (``time.process_time``) instead of wall time:
with one thread that is the work done whatever else runs on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smoke import add_smoke_flag, apply_smoke  # noqa: E402

from mechlingo.kernels.grouped import grouped_auroc_and_average_precision  # noqa: E402
from mechlingo.kernels.ranking import (  # noqa: E402
    auroc,
    auroc_and_average_precision,
    average_precision,
)


def make_data(n_samples: int, n_features: int, pos_rate: float, seed: int, device: str):
    """Pooled-activation-like scores: Gaussian noise, with 5% of features shifted up on the
    positives (the 'experts') so the scores span the whole range."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    labels = torch.zeros(n_samples, dtype=torch.bool)
    n_pos = max(1, round(n_samples * pos_rate))
    labels[torch.randperm(n_samples, generator=g)[:n_pos]] = True
    scores = torch.empty(n_samples, n_features)
    scores.normal_(generator=g)  # in place: no temporary copy
    experts = torch.randperm(n_features, generator=g)[: max(1, n_features // 20)]
    shift = torch.rand(experts.numel(), generator=g) * 2.0
    scores[:, experts] += labels[:, None].float() * shift
    return scores.to(device), labels.to(device)


CLOCK = {"now": time.perf_counter}  # or time.process_time (--clock cpu)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        sync(device)
        t0 = CLOCK["now"]()
        out = fn()
        sync(device)
        best = min(best, CLOCK["now"]() - t0)
    return best, out


def peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux, bytes on macOS
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n-samples", type=int, default=2000)
    ap.add_argument("--n-features", type=int, default=18 * 2048)
    ap.add_argument("--pos-rate", type=float, default=1 / 12)
    ap.add_argument("--sklearn-features", type=int, default=2000, help="subset timed with sklearn")
    ap.add_argument(
        "--chunk-size", type=int, default=None, help="features per block (default auto)"
    )
    ap.add_argument("--repeats", type=int, default=3, help="kernel timing: best of N")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--groups", type=int, default=12, help="languages scored at once")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="what is timed")
    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, {"device": "cpu", "n_samples": 120, "n_features": 64,
                       "sklearn_features": 12, "repeats": 1, "groups": 3})  # fmt: skip
    CLOCK["now"] = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)

    from sklearn.metrics import average_precision_score, roc_auc_score

    dev = args.device
    print(
        f"device={dev}  torch={torch.__version__}  threads={torch.get_num_threads()}  "
        f"n_samples={args.n_samples}  n_features={args.n_features}  pos_rate={args.pos_rate:.4f}  "
        f"clock={args.clock}"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average (1 min) at start: {load:.2f} on {os.cpu_count()} CPUs")
    scores, labels = make_data(args.n_samples, args.n_features, args.pos_rate, args.seed, dev)
    print(f"positives={int(labels.sum())}  scores {tuple(scores.shape)} {scores.dtype}")

    # warm-up (CUDA context, kernels, allocator) on a small slice
    auroc_and_average_precision(scores[:, :64], labels)
    sync(dev)

    # ---- kernel: memory first, in a clean state
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t_both, (auc, apr) = timed(
            lambda: auroc_and_average_precision(scores, labels, args.chunk_size), dev, 1
        )
        peak = torch.cuda.max_memory_allocated() - base
        mem_note = "torch.cuda.max_memory_allocated above inputs"
    else:
        base = peak_rss_bytes()
        t_both, (auc, apr) = timed(
            lambda: auroc_and_average_precision(scores, labels, args.chunk_size), dev, 1
        )
        peak = peak_rss_bytes() - base
        mem_note = "growth of peak RSS (ru_maxrss) during the first kernel call"
    t_both = min(
        t_both,
        timed(
            lambda: auroc_and_average_precision(scores, labels, args.chunk_size), dev, args.repeats
        )[0],
    )
    t_auc, _ = timed(lambda: auroc(scores, labels, args.chunk_size), dev, args.repeats)
    t_ap, _ = timed(lambda: average_precision(scores, labels, args.chunk_size), dev, args.repeats)

    # ---- the floor: one sort of the same array (every feature's samples, feature-major, the
    # layout a sort needs), timed the same way; any exact rank statistic needs at least this
    x_fm = scores.T.contiguous()
    if dev.startswith("cuda"):
        t_sort, _ = timed(lambda: torch.sort(x_fm, dim=-1), dev, args.repeats)
    else:
        x_np = x_fm.numpy()
        t_sort, _ = timed(lambda: np.sort(x_np, axis=-1), dev, args.repeats)
        del x_np

    # ---- scikit-learn loop on a random subset, extrapolated
    n_sub = min(args.sklearn_features, args.n_features)
    rng = np.random.default_rng(args.seed)
    cols = np.sort(rng.choice(args.n_features, size=n_sub, replace=False))
    x_sub = scores[:, torch.from_numpy(cols).to(scores.device)].cpu().numpy()
    y = labels.cpu().numpy()
    t0 = CLOCK["now"]()
    ref_auc = np.array([roc_auc_score(y, x_sub[:, j]) for j in range(n_sub)])
    t1 = CLOCK["now"]()
    ref_ap = np.array([average_precision_score(y, x_sub[:, j]) for j in range(n_sub)])
    t2 = CLOCK["now"]()
    scale = args.n_features / n_sub
    sk_auc, sk_ap = (t1 - t0) * scale, (t2 - t1) * scale
    sk_both = sk_auc + sk_ap

    auc_np, ap_np = auc.cpu().numpy()[cols], apr.cpu().numpy()[cols]
    d_auc = float(np.abs(auc_np - ref_auc).max())
    d_ap = float(np.abs(ap_np - ref_ap).max())

    print()
    print(f"kernel  auroc+AP (one pass) : {t_both:8.3f} s   (best of {args.repeats + 1})")
    print(f"kernel  auroc only          : {t_auc:8.3f} s")
    print(f"kernel  average_precision   : {t_ap:8.3f} s")
    extrap = "" if n_sub == args.n_features else f", extrapolated x{scale:.2f} from {n_sub}"
    print(
        f"sklearn roc_auc_score loop  : {sk_auc:8.3f} s   ({(t1 - t0) / n_sub * 1e3:.3f} ms/feature{extrap})"
    )
    print(
        f"sklearn average_precision   : {sk_ap:8.3f} s   ({(t2 - t1) / n_sub * 1e3:.3f} ms/feature{extrap})"
    )
    print(f"sklearn both                : {sk_both:8.3f} s")
    print()
    print(f"speed-up, both metrics      : {sk_both / t_both:8.1f} x   (target >= 300x)")
    print(f"speed-up, auroc only        : {sk_auc / t_auc:8.1f} x")
    print(f"speed-up, AP only           : {sk_ap / t_ap:8.1f} x")
    print(f"max |diff| vs sklearn on {n_sub} features: auroc {d_auc:.2e}, AP {d_ap:.2e}")
    print(f"kernel peak extra memory    : {peak / 2**20:8.1f} MiB   ({mem_note})")
    print(
        f"input scores                : {scores.numel() * scores.element_size() / 2**20:8.1f} MiB"
    )
    print(f"one sort of the same array  : {t_sort:8.3f} s   (the floor)")
    t_grp, t_sk_grp, t_loop, d_grp = all_languages(scores, args, rng)
    print(f"all {args.groups} languages (what score_neurons does): grouped kernel {t_grp:.3f} s, "
          f"one-language kernel x{args.groups} {t_loop:.3f} s, scikit-learn {t_sk_grp:.1f} s "
          f"(extrapolated), max |diff| vs scikit-learn {d_grp:.2e}")  # fmt: skip
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")
    print()
    print(f"auroc+AP over one sort (floor): {t_both / t_sort:.1f}x")
    print(f"all languages, grouped kernel over one sort (floor): {t_grp / t_sort:.1f}x")
    print(f"all languages, grouped kernel vs one-language kernel per language: "
          f"{t_loop / t_grp:.1f}x")  # fmt: skip
    print(f"all languages, grouped kernel vs scikit-learn: {t_sk_grp / t_grp:.1f}x")
    print(f"auroc+AP vs scikit-learn: {sk_both / t_both:.1f}x")


def all_languages(scores, args, rng):
    """Every language against the rest (``--groups`` languages of equal size, as
    ``score_neurons``): the grouped kernel (one sort for all), the one-language kernel once
    per language, and scikit-learn's two calls per feature and language on a subset
    (extrapolated). Returns their times and the largest |difference| to scikit-learn."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    n, f = scores.shape
    groups = torch.arange(n, device=scores.device) % args.groups
    dev = args.device
    t_grp, (au, ap) = timed(
        lambda: grouped_auroc_and_average_precision(scores, groups, args.groups), dev, 1
    )
    t_loop, _ = timed(
        lambda: [auroc_and_average_precision(scores, groups == i) for i in range(args.groups)],
        dev,
        1,
    )
    n_sub = max(1, min(args.sklearn_features // args.groups, f))
    cols = np.sort(rng.choice(f, size=n_sub, replace=False))
    x = scores[:, torch.from_numpy(cols).to(scores.device)].cpu().double().numpy()
    y = groups.cpu().numpy()
    diff = 0.0
    t0 = CLOCK["now"]()
    for i in range(args.groups):
        for jj, j in enumerate(cols):
            a = roc_auc_score(y == i, x[:, jj])
            p = average_precision_score(y == i, x[:, jj])
            diff = max(diff, abs(a - float(au[i, j])), abs(p - float(ap[i, j])))
    t_sk = (CLOCK["now"]() - t0) * f / n_sub
    return t_grp, t_sk, t_loop, diff


if __name__ == "__main__":
    main()

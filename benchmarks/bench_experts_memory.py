"""Benchmark: peak memory of the expert statistics against the number of sentences.

Runs ``find_experts`` (pooling every sentence's ``mlp_post`` into a row, AUROC + AP + LAPE of
every neuron for every language, then one clamp, which reads a few neurons' columns back) in
a fresh subprocess per size, so each size's peak resident set size (``ru_maxrss``) is its own:

* ``disk`` -- out of core (``store=``, ``max_memory=--max-memory``): rows stream to shards
  and are scored a block of neurons at a time;
* ``memory`` -- today's in-memory path (for contrast; it grows with the sentences).

Sentences: NTREX-128 dev lines (``$MECHLINGO_SHARED/data/ntrex/dev``, ``--langs`` languages,
``n / n_langs`` lines each, cycled when a language has fewer), else synthetic word strings;
the first ``--max-tokens`` tokens of each. Model: a random Gemma-3-architecture model with a
wide MLP (``--layers`` x ``--d-mlp`` neurons, so the statistics dominate memory; its values
mean nothing, the cost is the point), or ``--model PATH``.

The projection comes first: from the measured scoring rate and shard I/O, the disk size and
scoring time for FLORES-200 devtest x 22 languages x a 7B model (32 x 11,008 neurons). The
last lines give the peak RSS ratio of the largest to the smallest size per mode (goal: within
1.2x out of core), the out-of-core path's time over the in-memory path's (its cost) and,
last, ``memory_vs_disk_peak_rss_nN: N.Nx``: the in-memory path's peak RSS over the
out-of-core path's at the largest size (what out of core saves). Under ``--smoke`` the sizes
run in this process (their peak RSS is then the process's, not each size's own).

    OMP_NUM_THREADS=1 python benchmarks/bench_experts_memory.py
    OMP_NUM_THREADS=1 python benchmarks/bench_experts_memory.py --sizes 1000,8000 --modes disk
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smoke import add_smoke_flag, apply_smoke  # noqa: E402

SHARED = Path(os.environ.get("MECHLINGO_SHARED", Path(__file__).resolve().parents[2] / "shared"))
NTREX = SHARED / "data" / "ntrex" / "dev"
if not NTREX.is_dir():
    NTREX = Path("/work/shared/data/ntrex/dev")
LANGS = "en,de,es,fr,ru,zh,ar,hi"


def sentences(n: int, langs: list[str]) -> dict[str, list[str]]:
    """``n`` sentences over ``langs`` (NTREX lines, cycled; synthetic words without NTREX)."""
    per = max(1, n // len(langs))
    out = {}
    for i, lg in enumerate(langs):
        f = NTREX / f"{lg}.txt"
        lines = (
            [x for x in f.read_text(encoding="utf-8").splitlines() if x.strip()]
            if f.is_file()
            else []
        )
        if not lines:
            lines = [f"w{i}x{j % 97} t{j % 13} q{j}" for j in range(per)]
        out[lg] = [lines[j % len(lines)] for j in range(per)]
    return out


def child(args: argparse.Namespace) -> None:
    """One size in this (child) process: its measurements as one JSON line."""
    print(json.dumps(measure(args)))


def measure(args: argparse.Namespace) -> dict:
    """``find_experts`` on ``args.n`` sentences, ``args.mode`` (disk or memory): sizes, peak
    RSS (before and after), seconds, bytes on disk and shards."""
    import torch

    from mechlingo.analyses.experts import find_experts
    from mechlingo.core.models import load_model
    from mechlingo.testing import build_tiny_folder

    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or build_tiny_folder(
            Path(tmp) / "m", n_layers=args.layers, d_mlp=args.d_mlp
        )
        model = load_model(folder, device="cpu")
        texts = sentences(args.n, args.langs.split(","))
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        store = Path(tmp) / "shards" if args.mode == "disk" else None
        t0 = time.perf_counter()
        res = find_experts(
            model, texts, batch_size=args.batch_size, max_tokens=args.max_tokens, store=store,
            max_memory=args.max_memory if store else None,
        )  # fmt: skip
        t1 = time.perf_counter()
        res.clamp(res.langs[0], 100)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        n_rows, n_feat = res.stats.pooled.shape
        disk = sum(p.stat().st_size for p in store.glob("*.f32")) if store else 0
        return {
            "n": int(n_rows), "features": int(n_feat), "langs": len(res.langs),
            "peak_rss": peak, "rss_before": base, "seconds": t1 - t0, "disk_bytes": disk,
            "shards": res.stats.meta.get("out_of_core", {}).get("shards", 0),
        }  # fmt: skip


def score_rate(n: int, features: int, n_langs: int) -> tuple[float, float]:
    """Measured in this process: (sentence x neuron x language scored per second by the
    block scorer, bytes per second of shard writes + reads), on random rows."""
    import torch

    from mechlingo.activations.shards import PooledShards, ShardWriter, shard_scores

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    lang = torch.arange(n) % n_langs
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        w = ShardWriter(tmp, features, 256 * 2**20)
        w.add(x, torch.arange(n), lang)
        w.close()
        s = PooledShards(tmp, features)
        blocks = sum(b.numel() for _, _, b in s.blocks(1024))
        t_io = time.perf_counter() - t0
        t0 = time.perf_counter()
        shard_scores(s, n_langs, 256 * 2**20)
        t_score = time.perf_counter() - t0
    return n * features * n_langs / t_score, 2 * 4 * blocks / t_io


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,2000,4000,8000")
    ap.add_argument("--modes", default="disk,memory")
    ap.add_argument("--langs", default=LANGS)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-mlp", type=int, default=2048)
    ap.add_argument("--model", default=None, help="a model folder instead of the random one")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-memory", default="64M", help="cap of the out-of-core path")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="disk", help=argparse.SUPPRESS)
    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, {"sizes": "24,48", "langs": "en,de", "layers": 1, "d_mlp": 64,
                       "max_tokens": 4, "batch_size": 16})  # fmt: skip
    if args.child:
        return child(args)
    print(f"load average at start: {os.getloadavg()} on {os.cpu_count()} CPUs; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")  # fmt: skip
    print(f"sentences: {'NTREX ' + str(NTREX) if NTREX.is_dir() else 'synthetic'}; "
          f"languages {args.langs}; max_tokens {args.max_tokens}")  # fmt: skip
    results: dict[str, list[dict]] = {}
    for mode in args.modes.split(","):
        for n in (int(x) for x in args.sizes.split(",")):
            r = run_size(args, mode, n)
            results.setdefault(mode, []).append(r)
            print(f"{mode:6s} n={r['n']:6d} x {r['features']} neurons: peak RSS "
                  f"{r['peak_rss'] / 2**20:8.1f} MiB (after load {r['rss_before'] / 2**20:7.1f}), "
                  f"{r['seconds']:6.1f} s, {r['shards']} shards, "
                  f"{r['disk_bytes'] / 2**20:7.1f} MiB on disk", flush=True)  # fmt: skip
    first = next(iter(results.values()))
    rate, io = score_rate(first[-1]["n"], first[-1]["features"], first[-1]["langs"])
    n7, f7, l7 = 22 * 1012, 32 * 11008, 22
    size = 4 * n7 * f7
    print(f"\nscoring rate here: {rate / 1e6:.1f} M sentence-neuron-language/s; shard I/O "
          f"{io / 2**20:.0f} MiB/s (page cache; a cold disk is slower)")  # fmt: skip
    print(f"projection FLORES-200 devtest x {l7} languages ({n7} sentences) x 7B "
          f"({f7} neurons): {size / 1e9:.1f} GB of shards (in memory today: the same, in RAM); "
          f"scoring {n7 * f7 * l7 / rate / 3600:.1f} h on this CPU at the rate above "
          f"(one thread), I/O {2 * size / io / 60:.1f} min; memory: the cap")  # fmt: skip
    print()
    for mode, rs in results.items():
        if len(rs) > 1:
            ratio = rs[-1]["peak_rss"] / rs[0]["peak_rss"]
            print(f"{mode}_peak_rss_{rs[-1]['n']}_vs_{rs[0]['n']}: {ratio:.2f}x"
                  + ("   (goal <= 1.2x)" if mode == "disk" else ""))  # fmt: skip
    if "disk" in results and "memory" in results:
        d, m = results["disk"][-1], results["memory"][-1]
        print(f"disk_vs_memory_time_n{d['n']}: {d['seconds'] / m['seconds']:.1f}x   (the cost)")
        print(f"memory_vs_disk_peak_rss_n{d['n']}: {m['peak_rss'] / d['peak_rss']:.2f}x")


def run_size(args: argparse.Namespace, mode: str, n: int) -> dict:
    """One size's measurements: in a fresh process (its own peak RSS), or in this one under
    ``--smoke``."""
    if args.smoke:
        return measure(argparse.Namespace(**{**vars(args), "mode": mode, "n": n}))
    cmd = [sys.executable, __file__, "--child", "--n", str(n), "--mode", mode]
    for k in ("langs", "layers", "d_mlp", "max_tokens", "batch_size", "max_memory"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    if args.model:
        cmd += ["--model", args.model]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"{mode} n={n} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()

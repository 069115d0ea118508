"""Benchmark: building and applying steering vectors, mechlingo against steering-vectors.

The same model (the embedded gemma-3-270m), the same prompts, in one run:

* mechlingo: ``build_steering_vectors(facts, BuildSettings(translation_shots=0, unit="raw"))`` (the task vector = mean few-shot
  minus mean zero-shot last-token ``resid_pre``, the diff vector = mean translation prompt
  minus mean zero-shot, every layer; plus one pass for the residual norms), then the task
  vector of ``--layer`` added at every position (BOS included, as steering-vectors does)
  through ``intervene`` and the steered
  last-token logits of ``--apply`` held-out zero-shot prompts;
* steering-vectors 0.12 (``train_steering_vector`` on the pairs (few-shot, zero-shot) and
  (translation, zero-shot) of the same facts, every layer, then ``SteeringVector.apply`` of
  the task vector at the same place). It needs transformers < 5, so it runs in its own
  environment (``scripts/build_peer_envs.sh sv``; ``benchmarks/peer_sv.py``), timed there.

mechlingo's ``resid_pre`` of layer ``l`` is the output of decoder layer ``l - 1``, where
steering-vectors reads and adds. The vectors and the steered logits are checked equal before
the times are compared; the last lines are ``name: N.Nx`` (the other's time over ours): first
the same steering written with TransformerLens alone (a ``run_with_hooks`` hook that adds the
vector, the whole forward pass), which every run measures, then steering-vectors, when its
environment is there (not under ``--smoke``).

    OMP_NUM_THREADS=1 python benchmarks/bench_steering.py [--n 8] [--layer 6] [--peer PY]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from smoke import add_smoke_flag, apply_smoke, bench_model, skipped  # noqa: E402

from mechlingo.activations.runs import collect, final_resid_name  # noqa: E402
from mechlingo.analyses.recall.settings import BuildSettings  # noqa: E402
from mechlingo.analyses.recall.steering import build_steering_vectors, steering_prompts  # noqa: E402
from mechlingo.core.models import ensure_default_model  # noqa: E402
from mechlingo.core.tokens import encode  # noqa: E402
from mechlingo.data import load_facts  # noqa: E402
from mechlingo.interventions import SteeringVector, intervene  # noqa: E402
from mechlingo.kernels.readout import final_logits  # noqa: E402

LANGS = ["fr", "de", "es", "ru", "ja", "zh"]


def peer_python(given: str | None) -> Path | None:
    for p in [given, os.environ.get("PEER_SV"), ROOT / ".venv-sv", ROOT.parent / "perf-venv-sv"]:
        if p:
            py = Path(p) / "bin" / "python" if Path(p).is_dir() else Path(p)
            if py.is_file():
                return py
    return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=8, help="facts per language (build)")
    ap.add_argument("--apply", type=int, default=16, help="held-out prompts to steer")
    ap.add_argument("--layer", type=int, default=6, help="resid_pre layer of the vector")
    ap.add_argument("--alpha", type=float, default=4.0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--peer", default=None, help="python of the steering-vectors environment")
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, {"n": 4, "apply": 2, "layer": 1, "batch_size": 4})
    torch.set_grad_enabled(False)
    print(f"load average at start: {os.getloadavg()}; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}")  # fmt: skip
    model = bench_model(args, device="cpu")
    facts = load_facts(langs=LANGS, relations=["capital"], limit=args.n + args.apply)
    build, held = [], []
    for lg in LANGS:
        mine = [f for f in facts if f.lang == lg]
        build += mine[: args.n]
        held += mine[args.n :]
    held = held[: args.apply]
    prompts = steering_prompts(build, translation_shots=0)
    counts = {k: len(v) for k, v in prompts.items()}
    if len(set(counts.values())) != 1:
        raise SystemExit(f"unpaired prompt sets {counts}: the mean difference needs pairs")
    print(f"{len(build)} build facts ({counts}), {len(held)} prompts to steer, layer "
          f"{args.layer}, alpha {args.alpha}")  # fmt: skip
    apply = [f.prompt for f in held]
    # the prompts of steering_prompts(build, translation_shots=0), as steering-vectors gets
    raw = BuildSettings(translation_shots=0, unit="raw", batch_size=args.batch_size)
    build_steering_vectors(model, build[:2], raw, pool=build)  # warm-up
    t0 = time.perf_counter()
    rv = build_steering_vectors(model, build, raw)
    t_build = time.perf_counter() - t0
    vec = SteeringVector(
        rv.task.vector, layer=args.layer, alpha=args.alpha, positions="all_with_bos"
    )
    batch = encode(model, apply)
    name = final_resid_name(model)

    def steer() -> torch.Tensor:
        with intervene(model, vec, batch=batch):
            return final_logits(model, collect(model, batch, [name])[name])

    steer()
    t0 = time.perf_counter()
    ours = steer()
    t_apply = time.perf_counter() - t0
    print(f"mechlingo: build_steering_vectors {t_build:.2f} s, intervene + forward {t_apply:.2f} s")
    t_hooks = hooks_alternative(model, batch, vec, ours)
    print(f"TransformerLens run_with_hooks + full logits {t_hooks:.2f} s")
    ratios = [f"apply vs TransformerLens run_with_hooks: {t_hooks / t_apply:.1f}x"]
    py = None if args.smoke else peer_python(args.peer)
    if args.smoke:
        skipped("steering-vectors (its own environment)")
    elif py is None:
        print("steering-vectors: not installed (build it with scripts/build_peer_envs.sh sv)")
    if py is None:
        print("\n" + "\n".join(ratios))
        return
    with tempfile.TemporaryDirectory() as tmp:
        job = {
            "folder": str(args.model or ensure_default_model()),
            "task_pairs": list(zip(prompts["few_shot"], prompts["zero_shot"], strict=True)),
            "diff_pairs": list(zip(prompts["translation"], prompts["zero_shot"], strict=True)),
            "hf_layer": args.layer - 1,
            "alpha": args.alpha,
            "apply": apply,
            "batch_size": args.batch_size,
        }
        Path(tmp, "job.json").write_text(json.dumps(job))
        out = Path(tmp, "out.pt")
        proc = subprocess.run([str(py), str(ROOT / "benchmarks" / "peer_sv.py"),
                               str(Path(tmp, "job.json")), str(out)], capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=""))  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"steering-vectors run failed:\n{proc.stderr[-3000:]}")
        peer = torch.load(out)
    compare(rv, peer, ours, args.layer)
    print(f"steering-vectors: train x2 {peer['t_build']:.2f} s, apply + forward "
          f"{peer['t_apply']:.2f} s")  # fmt: skip
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print()
    print("\n".join(ratios))
    print(f"build vs steering-vectors train_steering_vector: {peer['t_build'] / t_build:.1f}x")
    print(f"apply vs steering-vectors apply: {peer['t_apply'] / t_apply:.1f}x")


def hooks_alternative(model, batch, vec: SteeringVector, ours: torch.Tensor) -> float:
    """The same steering written with TransformerLens alone (a hook that adds ``alpha * v``
    at every position of ``resid_pre``, then the whole forward pass and each prompt's
    last-token logits), checked equal to ``ours``; its seconds (best of two)."""
    add = vec.alpha * vec.direction(model)
    rows = torch.arange(batch.batch_size)

    def run() -> torch.Tensor:
        def hook(resid: torch.Tensor, hook) -> torch.Tensor:
            return resid + add.to(resid.dtype)

        name = f"blocks.{vec.layer}.hook_resid_pre"
        logits = model.run_with_hooks(batch.tokens, fwd_hooks=[(name, hook)])
        return logits[rows, batch.lengths - 1].float()

    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        theirs = run()
        times.append(time.perf_counter() - t0)
    diff = float((theirs.cpu() - ours.cpu()).abs().max())
    print(f"TransformerLens hooks: steered logits max |difference| {diff:.2e}")
    if diff > 1e-2:
        raise SystemExit("mechlingo and the TransformerLens hook disagree: not timed")
    return min(times)


def compare(rv, peer, ours: torch.Tensor, layer: int) -> None:
    """The vectors of every layer and the steered logits must agree before times count."""
    worst = 0.0
    for stack, key in ((rv.task.vector, "task"), (rv.diff.vector, "diff")):
        for hf_layer, v in peer[key].items():
            if hf_layer + 1 < stack.shape[0]:
                mine = stack[hf_layer + 1].float()
                worst = max(worst, float((mine - v).norm() / v.norm().clamp_min(1e-12)))
    d_logits = float((ours.cpu() - peer["steered"]).abs().max())
    print(f"vectors: max relative difference {worst:.2e} over every layer; steered logits: "
          f"max |difference| {d_logits:.2e}")  # fmt: skip
    if worst > 1e-3 or d_logits > 1e-2:
        raise SystemExit("mechlingo and steering-vectors disagree: not timed")


if __name__ == "__main__":
    main()

"""mechlingo on a GPU: lens, patching, vector building and neuron scoring, with ratios.

With CUDA: the model in bfloat16 on the GPU (readouts and statistics in float32), sizes that
fill the device, and for each workload its throughput, the ratio to the same code on the CPU
(timed on a subset of the work and scaled per item) and to the TransformerLens alternative:

1. logit lens: ``mechlingo.analyses.decoders.lens.logit_lens`` vs TransformerLens's
   ``tools.analysis.logit_lens`` one prompt at a time (subset, scaled per prompt);
2. activation patching: ``mechlingo.analyses.recall.patching.patch_activations`` over every layer of
   ``resid_pre`` at the last token (skipped with a message when the module is missing);
3. vector building: streaming float64 means of the last-token residual stream of every layer
   (``mechlingo.activations.runs.last_token_means``);
4. neuron scoring: ``kernels.ranking.auroc_and_average_precision`` on synthetic activations of
   32 x 11,008 neurons (a 7B model's MLPs) over several thousand sentences vs scikit-learn's
   per-feature loop timed on a subset and extrapolated;
5. steering conditions: ``mechlingo.scoring.evaluate.evaluate_conditions`` (one shared prefix
   pass per batch, the conditions decoded stacked) vs ``evaluate_facts`` one condition at a
   time, on ``orig`` + 8 ``"last"`` steering settings (the records checked equal);
6. candidate ranking: ``mechlingo.scoring.rank.score_candidates`` (batched) vs each filled
   sentence alone with a full ``log_softmax`` (``benchmarks/bench_rank.py``'s reference).

Without CUDA it runs small CPU sizes on the tiny random model (or ``--model``) and says so.
The last lines are each workload's speed-up over each alternative, ``<workload> vs
<alternative>: N.Nx``.
Usage: python benchmarks/bench_gpu.py [--model PATH] [--prompts N] [--samples N]
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from smoke import add_smoke_flag, apply_smoke

from mechlingo.activations.runs import collect, last_token_means
from mechlingo.analyses.decoders.lens import logit_lens
from mechlingo.core.answers import answer_tokens
from mechlingo.core.models import load_model
from mechlingo.core.sites import hook_name
from mechlingo.core.tokens import encode
from mechlingo.data import load_facts
from mechlingo.interventions import SteeringVector
from mechlingo.kernels.ranking import auroc_and_average_precision
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_conditions, evaluate_facts
from mechlingo.scoring.rank import score_candidates
from mechlingo.testing import tiny_model


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], repeats: int = 1) -> tuple[float, Any]:
    """Best wall time of ``repeats`` runs after one warm-up run."""
    out = fn()
    best = float("inf")
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best, out


#: (workload, alternative, speed-up) of every report line, printed last as ``name: N.Nx``
SPEEDUPS: list[tuple[str, str, float]] = []


def report(name: str, seconds: float, items: int, unit: str, others: dict[str, float]) -> None:
    """One line: time, throughput, then 'Nx faster than X' for each alternative (seconds
    scaled to the same number of items); the speed-ups are kept for the last lines."""
    line = f"{name:22s} {seconds:8.3f} s  {items / seconds:12.1f} {unit}/s"
    for other, t in others.items():
        line += f"  | {t / seconds:7.1f}x vs {other}"
        SPEEDUPS.append((name, other, t / seconds))
    print(line, flush=True)


def prompts_and_answers(n: int) -> tuple[list[str], list[str], list[str]]:
    langs = ["en", "fr", "de", "es", "ja", "zh", "ru", "ar"]
    facts = load_facts(langs=langs, relations=["capital"])
    reps = (n + len(facts) - 1) // len(facts)
    facts = (facts * reps)[:n]
    return [f.prompt for f in facts], [f.answer for f in facts], [f.lang for f in facts]


def load(args: argparse.Namespace, device: str, dtype: torch.dtype) -> Any:
    if args.model is None and device == "cpu":
        return tiny_model(tempfile.mkdtemp(prefix="bench-gpu-tiny-"), n_layers=4, d_model=128)
    return load_model(args.model, device=device, dtype=dtype)


def bench_lens(model: Any, cpu_model: Any | None, n: int, tl_n: int, batch: int) -> None:
    prompts, words, langs = prompts_and_answers(n)

    def ours(m: Any, k: int) -> Any:
        return logit_lens(
            m, prompts[:k], {"a": words[:k]}, langs=langs[:k], batch_size=batch, top_k=1
        )

    t, _ = timed(lambda: ours(model, n))
    others = {}
    if cpu_model is not None:
        k = max(1, min(n, 32))
        tc, _ = timed(lambda: ours(cpu_model, k))
        others["mechlingo on CPU"] = tc * n / k
    from transformer_lens.tools.analysis import logit_lens as tl_lens

    k = max(1, min(n, tl_n))
    targets = [
        answer_tokens(model, w, lang=lg, prefixes=False).primary
        for w, lg in zip(words, langs, strict=True)
    ]

    def tl() -> None:
        for p, tgt in zip(prompts[:k], targets[:k], strict=True):
            tl_lens(model, model.to_tokens(p), targets=[tgt], return_type="log_probs")

    tt, _ = timed(tl)
    others["TL logit_lens/prompt"] = tt * n / k
    report("logit lens", t, n, "prompts", others)


def bench_patching(model: Any, n: int) -> None:
    if importlib.util.find_spec("mechlingo.analyses.recall.patching") is None:
        print("activation patching    skipped: mechlingo.analyses.recall.patching is not there yet")
        return
    from mechlingo.analyses.recall.patching import answer_logprob, patch_activations

    prompts, words, langs = prompts_and_answers(2 * n)
    src, tgt = prompts[:n], prompts[n : 2 * n]
    metric = answer_logprob(model, words[:n], langs[:n])
    n_layers = int(model.cfg.n_layers)

    def run(batching: str) -> Any:
        return patch_activations(
            model, src, tgt, "resid_pre", alignment="last", readout=metric, batching=batching
        )

    # grow: one example per pass (shared prefix); stack: all examples per pass. On a GPU the
    # second may win for many examples: this prints both.
    t_stack, _ = timed(lambda: run("stack"))
    t, _ = timed(lambda: run("grow"))
    report("activation patching (grow)", t, n * n_layers, "cells", {"batching='stack'": t_stack})


def bench_vectors(model: Any, cpu_model: Any | None, n: int, batch: int) -> None:
    prompts, _, _ = prompts_and_answers(n)

    def ours(m: Any, k: int) -> Any:
        return last_token_means(m, prompts[:k], batch_size=batch).mean

    t, mean = timed(lambda: ours(model, n))
    assert mean.dtype == torch.float64
    others = {}
    if cpu_model is not None:
        k = max(1, min(n, 64))
        tc, _ = timed(lambda: ours(cpu_model, k))
        others["mechlingo on CPU"] = tc * n / k
    report("vector building", t, n, "prompts", others)


def bench_neurons(samples: int, features: int, sk_features: int, device: str) -> None:
    g = torch.Generator().manual_seed(0)
    labels = torch.rand(samples, generator=g) < 0.125  # one language of eight
    scores = torch.randn(samples, features, generator=g)
    scores[:, : features // 20] += labels[:, None].float()
    x, y = scores.to(device), labels.to(device)
    t, (auc, ap) = timed(lambda: auroc_and_average_precision(x, y))
    others = {}
    if device != "cpu":
        k = min(features, 4096)
        tc, _ = timed(lambda: auroc_and_average_precision(scores[:, :k], labels))
        others["mechlingo on CPU"] = tc * features / k
    try:
        from sklearn.metrics import average_precision_score, roc_auc_score

        k = min(features, sk_features)
        xs, ys = scores[:, :k].numpy(), labels.numpy()
        t0 = time.perf_counter()
        ref = np.array([roc_auc_score(ys, xs[:, j]) for j in range(k)])
        ref_ap = np.array([average_precision_score(ys, xs[:, j]) for j in range(k)])
        others["sklearn loop (extrap.)"] = (time.perf_counter() - t0) * features / k
        d = max(
            float(np.abs(auc[:k].cpu().numpy() - ref).max()),
            float(np.abs(ap[:k].cpu().numpy() - ref_ap).max()),
        )
        print(f"{'':22s} max |diff| vs sklearn on {k} features: {d:.1e}")
    except ImportError:
        print(f"{'':22s} scikit-learn not installed: no sklearn comparison")
    report("neuron AUROC+AP", t, features, "features", others)


def bench_conditions(model: Any, n: int, batch: int) -> None:
    langs = ["en", "fr", "de", "es", "ja", "zh"]
    facts = load_facts(langs=langs, relations=["capital"])
    facts = (facts * ((n + len(facts) - 1) // len(facts)))[:n]
    b = encode(model, [f.prompt for f in facts[:16]])
    names = [hook_name(model, "resid_pre", la) for la in range(int(model.cfg.n_layers))]
    acts = collect(model, b, names)
    norms = [float(acts[nm].float().norm(dim=-1).mean()) for nm in names]
    g = torch.Generator().manual_seed(0)
    conds: dict[str, Any] = {"orig": None}
    n_layers = int(model.cfg.n_layers)
    for i, layer in enumerate(sorted({round(f * (n_layers - 1)) for f in (0.25, 0.5, 0.75)})):
        for alpha in (0.06, 0.3):
            v = torch.randn(int(model.cfg.d_model), generator=g)
            conds[f"{i}:{alpha}"] = SteeringVector(v / v.norm() * norms[layer], layer, alpha)
    kw = {"decoding": DecodeOptions(max_new_tokens=6, batch_size=batch)}
    t, shared = timed(lambda: evaluate_conditions(model, facts, conds, **kw))
    t_alone, alone = timed(
        lambda: {c: evaluate_facts(model, facts, intervention=iv, **kw) for c, iv in conds.items()}
    )
    same = all(shared[c].records == alone[c].records for c in conds)
    print(f"{'':22s} {len(conds)} conditions, records equal: {same}")
    report("steering conditions", t, n * len(conds), "items", {"one at a time": t_alone})


def bench_rank(model: Any, n: int, batch: int) -> None:
    try:
        from bench_rank import cloze_facts, one_by_one
    except ImportError:
        print("candidate ranking      skipped: run from benchmarks/ (needs bench_rank.py)")
        return
    facts = cloze_facts(n, 8)
    t, _ = timed(lambda: score_candidates(model, facts, batch_size=batch))
    k = max(1, min(n, 8))
    t1, _ = timed(lambda: one_by_one(model, facts[:k]))
    report("candidate ranking", t, n * 8, "candidates", {"one by one (extrap.)": t1 * n / k})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None, help="default: embedded model (tiny on CPU)")
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--samples", type=int, default=None, help="sentences for neuron scoring")
    ap.add_argument("--features", type=int, default=32 * 11008)
    ap.add_argument("--sklearn-features", type=int, default=300)
    ap.add_argument("--tl-prompts", type=int, default=16)
    ap.add_argument("--no-cpu-ratio", action="store_true", help="skip the CPU comparisons")
    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, {"prompts": 4, "batch": 2, "samples": 200, "features": 256,
                       "sklearn_features": 8, "tl_prompts": 2})  # fmt: skip
    SPEEDUPS.clear()
    torch.set_grad_enabled(False)
    cuda = torch.cuda.is_available()
    if cuda:
        device, dtype = "cuda", torch.bfloat16
        n, batch, samples = args.prompts or 1024, args.batch or 128, args.samples or 16384
        features = args.features
        print(f"CUDA: {torch.cuda.get_device_name()}; model in bfloat16, readouts in float32")
    else:
        device, dtype = "cpu", torch.float32
        n, batch, samples = args.prompts or 32, args.batch or 16, args.samples or 2000
        features = min(args.features, 4096)
        print("no CUDA: running small CPU sizes (tiny random model unless --model); the GPU")
        print("numbers come from running this script on a machine with a GPU.")
    model = load(args, device, dtype)
    cpu_model = None
    if cuda and not args.no_cpu_ratio:
        cpu_model = load(argparse.Namespace(model=args.model), "cpu", torch.float32)
    print(
        f"model {getattr(model.cfg, 'model_name', '?')}: {model.cfg.n_layers} layers, "
        f"d_model {model.cfg.d_model}, vocab {model.cfg.d_vocab}; {n} prompts, batch {batch}"
    )
    bench_lens(model, cpu_model, n, args.tl_prompts, batch)
    bench_patching(model, min(n, 256))
    bench_vectors(model, cpu_model, n, batch)
    bench_neurons(samples, features, args.sklearn_features, device)
    bench_conditions(model, min(n, 384), batch)
    bench_rank(model, min(n, 64), min(batch, 16))
    if cuda:
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    print()
    for name, other, ratio in SPEEDUPS:
        print(f"{name} vs {other}: {ratio:.1f}x")


if __name__ == "__main__":
    main()

"""Logit lens on 32 mixed-language prompts, three ways in one process.

1. mechlingo: one batched forward per 16 prompts (right-padded), only the last real token of
   each layer read, the unembedding done in chunks, no full-sequence logits.
2. TransformerLens 4's ``tools.analysis.logit_lens``, one prompt at a time (a padded batch read
   at position -1 would read padding for the shorter prompts), with the answer tokens as
   targets.
3. A per-layer Python loop: ``run_with_cache`` of every residual stream, then for each layer
   ln_final + unembedding of every position, then pick the last real token.

Prints the times, the ratios and the largest difference of the answers' log-probabilities.
Usage: python benchmarks/bench_lens.py [--n 32] [--device cpu|cuda] [--model PATH]
"""

from __future__ import annotations

import argparse
import time

import torch

from mechlingo.analyses.lens import logit_lens
from mechlingo.core.models import load_model
from mechlingo.core.tokens import answer_tokens
from mechlingo.data import load_facts
from mechlingo.kernels.readout import final_logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--device", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    model = load_model(args.model, device=args.device)
    langs = ["en", "fr", "de", "es", "ja", "zh", "ru", "ar"]
    facts = load_facts(langs=langs, relations=["capital"], limit=args.n // len(langs) + 1)
    facts = facts[: args.n]
    prompts = [f.prompt for f in facts]
    words = [f.answer for f in facts]
    fl = [f.lang for f in facts]
    lengths = [model.to_tokens(p).shape[1] for p in prompts]
    print(
        f"{len(prompts)} prompts in {len(set(fl))} languages, {min(lengths)}-{max(lengths)} tokens"
    )
    primary = [
        answer_tokens(model, w, lang=lg, prefixes=False).primary
        for w, lg in zip(words, fl, strict=True)
    ]
    answer_tokens(model, "warm-up")  # build the vocabulary index outside the timings

    def ours() -> torch.Tensor:
        r = logit_lens(model, prompts, {"a": words}, langs=fl, batch_size=16, top_k=1)
        return r.primary_logprob[:, :, 0]

    def tl() -> torch.Tensor:
        from transformer_lens.tools.analysis import logit_lens as tl_lens

        cols = []
        for p, t in zip(prompts, primary, strict=True):
            res = tl_lens(model, model.to_tokens(p), targets=[t], return_type="log_probs")
            cols.append(res.values.reshape(-1))
        return torch.stack(cols, 1)

    def loop() -> torch.Tensor:
        n = model.cfg.n_layers
        names = [f"blocks.{i}.hook_resid_pre" for i in range(n)] + [
            f"blocks.{n - 1}.hook_resid_post"
        ]
        cols = []
        for p, t in zip(prompts, primary, strict=True):
            _, cache = model.run_with_cache(model.to_tokens(p), names_filter=names)
            col = []
            for name in names:
                logp = torch.log_softmax(final_logits(model, cache[name][0]), -1)
                col.append(logp[-1, t])
            cols.append(torch.stack(col))
        return torch.stack(cols, 1)

    results = {}
    for name, fn in [
        ("mechlingo", ours),
        ("transformer_lens.logit_lens", tl),
        ("per-layer loop", loop),
    ]:
        fn()  # warm-up
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = fn()
            best = min(best, time.perf_counter() - t0)
        results[name] = (best, out.cpu())
        print(f"{name:30s} {best:8.2f} s")
    base_t, base = results["mechlingo"]
    for name, (t, out) in results.items():
        if name == "mechlingo":
            continue
        diff = (out - base).abs().max().item()
        print(
            f"mechlingo is {t / base_t:5.1f}x faster than {name}; max |diff log-prob| = {diff:.2e}"
        )


if __name__ == "__main__":
    main()

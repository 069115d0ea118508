"""The readout cost of each decoder relative to the logit lens, in one process.

The same prompts and entries read four ways through :func:`mechlingo.analyses.decoders.lens.logit_lens`:

1. the logit lens (final norm + unembedding of each entry's last-token state);
2. a tuned lens (an affine translator per entry first: ``d_model^2`` multiply-adds per row,
   small beside the ``d_model x vocab`` unembedding) -- an identity-initialised lens with
   random translators, which costs what a trained one costs;
3. the patchscope (one target-prompt forward pass per entry and prompt, then the readout);
4. the patchscope with a 4-token greedy continuation.

Each is timed (best of ``--repeats`` after a warm-up). There is no other implementation to
beat here: every decoder pays at least the logit lens's readout, so the logit lens is the
floor, and the last lines are ``<decoder> over the logit lens (floor): N.Nx`` (its time over
the logit lens's, same run).

Usage: python benchmarks/bench_decoders.py [--n 8] [--model PATH] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import time

import torch
from smoke import add_smoke_flag, apply_smoke, bench_model

from mechlingo.analyses.decoders.lens import logit_lens
from mechlingo.analyses.decoders.patchscope import Patchscope
from mechlingo.analyses.decoders.tuned_lens import TunedLens
from mechlingo.data import load_facts
from mechlingo.data.fact_answers import fact_answers


def _best(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=8, help="prompts (default 8)")
    p.add_argument("--model", default=None, help="model folder (default the embedded model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=2)
    add_smoke_flag(p)
    args = apply_smoke(p.parse_args(argv), {"n": 2, "repeats": 1})
    torch.set_grad_enabled(False)
    model = bench_model(args, device=args.device)
    facts = load_facts(
        langs=["en", "es", "fr", "de", "ja", "zh", "ru", "ko"], relations=["capital"], limit=1
    )
    facts = facts[: args.n]
    answers = fact_answers(facts, ["en"])
    prompts, langs = [f.prompt for f in facts], [f.lang for f in facts]
    lens = TunedLens.for_model(model)
    with torch.no_grad():
        lens.weight.normal_(0, 1e-3)
    decoders = {
        "logit lens": None,
        "tuned lens": lens,
        "patchscope": Patchscope(),
        "patchscope + 4 tokens": Patchscope(max_new_tokens=4),
    }
    times = {}
    for name, dec in decoders.items():
        times[name] = _best(
            lambda dec=dec: logit_lens(model, prompts, answers, langs=langs, decoder=dec),
            args.repeats,
        )
        print(
            f"{name:24s} {times[name]:8.2f} s  ({len(prompts)} prompts x {model.cfg.n_layers + 1} entries)"
        )
    base = times["logit lens"]
    for name, t in times.items():
        if name != "logit lens":
            print(f"{name} over the logit lens (floor): {t / base:.1f}x")


if __name__ == "__main__":
    main()

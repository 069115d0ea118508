"""Benchmark: candidate ranking (BMLAMA's metric), batched against one sentence at a time.

``--facts`` facts x ``--candidates`` candidates, built from the bundled capitals (the gold
answer and other capitals of the same language, each filled in before the suffix ``"."``),
scored two ways in one process:

* batched: :func:`mechlingo.analyses.rank.score_candidates` (every candidate of
  ``--batch-size`` facts in one padded pass stopped after the last block; only the scored
  positions read, as target logit minus a streamed logsumexp; the stem read once per fact);
* one by one: each filled sentence alone through the model's full forward pass and a
  ``log_softmax`` over the vocabulary at every position (what the reference code does).

Both give the same scores (checked before timing). The last line is the ratio
``rank batched vs one-by-one: N.Nx``.

    python benchmarks/bench_rank.py                      # 16 facts x 8 candidates
    python benchmarks/bench_rank.py --facts 32 --candidates 10 --device cuda
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mechlingo.analyses.rank import score_candidates  # noqa: E402
from mechlingo.core.models import load_model  # noqa: E402
from mechlingo.data import load_facts  # noqa: E402


def cloze_facts(n: int, c: int) -> list:
    """``n`` bundled capital facts (en, fr alternating) with ``c`` candidates each."""
    facts = load_facts(langs=["en", "fr"], relations=["capital"], templates="natural")
    by_lang: dict[str, list] = {}
    for f in facts:
        by_lang.setdefault(f.lang, []).append(f)
    out = []
    for i in range(n):
        fs = by_lang["en" if i % 2 == 0 else "fr"]
        f = fs[i // 2]
        others = [g.answer for g in fs if g.answer != f.answer][i : i + c - 1]
        cands = others[: i % c] + [f.answer] + others[i % c :]
        out.append(replace(f, candidates=tuple(cands), suffix="."))
    return out


def one_by_one(model, facts) -> list[list[float]]:
    """Each filled sentence alone: full logits, log_softmax, mean over tokens after BOS."""
    out = []
    for f in facts:
        row = []
        for cand in f.candidates:
            ids = model.to_tokens(f.filled(cand), prepend_bos=True)
            with torch.no_grad():
                logits = model(ids)[0, :-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None].to(logits.device))
            row.append(float(-lp.mean()))
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--facts", type=int, default=16, help="facts (default 16)")
    ap.add_argument("--candidates", type=int, default=8, help="candidates per fact (default 8)")
    ap.add_argument("--batch-size", type=int, default=16, help="facts per batched pass")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    model = load_model(args.model, device=args.device)
    facts = cloze_facts(args.facts, args.candidates)
    n_sent = sum(len(f.candidates) for f in facts)
    dev = model.W_U.device

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    ref = one_by_one(model, facts[:2])  # warm-up and the equality check
    got = score_candidates(model, facts[:2], batch_size=args.batch_size).ce
    worst = max(
        abs(a - b) for r, g in zip(ref, got, strict=True) for a, b in zip(r, g, strict=True)
    )
    print(f"same scores: max |difference| {worst:.2e} nats/token")
    if worst > 1e-3:
        raise SystemExit("batched and one-by-one scores differ")

    sync()
    t0 = time.perf_counter()
    batched = score_candidates(model, facts, batch_size=args.batch_size)
    sync()
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    alone = one_by_one(model, facts)
    sync()
    t_alone = time.perf_counter() - t0
    worst = max(
        abs(a - b)
        for r, g in zip(alone, batched.ce, strict=True)
        for a, b in zip(r, g, strict=True)
    )
    print(
        f"{len(facts)} facts x {args.candidates} candidates = {n_sent} sentences on {dev}: "
        f"batched {t_batched:.2f} s, one by one {t_alone:.2f} s (max |difference| {worst:.1e})"
    )
    print(f"rank batched vs one-by-one: {t_alone / t_batched:.1f}x")


if __name__ == "__main__":
    main()

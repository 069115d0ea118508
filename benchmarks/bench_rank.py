"""Benchmark: candidate ranking (BMLAMA's metric), batched against one sentence at a time.

``--facts`` facts x ``--candidates`` candidates, built from the bundled capitals (the gold
answer and other capitals of the same language, each filled in before the suffix ``"."``),
scored two ways in one process:

* shared stems (the default): :func:`mechlingo.scoring.rank.score_candidates` runs each
  fact's shared tokens once (one row per fact, into a key-value cache) and then only each
  candidate's own tokens and the suffix against that cache; only the scored positions are
  read, as target logit minus a streamed logsumexp;
* batched (``shared=False``, the path before shared stems): every candidate of
  ``--batch-size`` facts in one padded pass over every position, stopped after the last
  block, the same reads;
* floor: the same two passes with no hook and the reads (the scored tokens' log-probabilities,
  a logsumexp over the vocabulary each, which no sharing of stems removes): what the
  shared-stem path cannot go below;
* one by one: each filled sentence alone through the model's full forward pass and a
  ``log_softmax`` over the vocabulary at every position (what the reference code does).

With ``--shots N`` every query follows the same ``N`` demonstrations of its language, which
the shared-stem path runs once per language and pass (one demonstration row, then each
fact's own stem tokens against it); it is also timed with each fact's stem run whole, the
path before that. All give the same scores (checked). The last lines are ``bench_rank_floor: N.Nx`` (shared
stems / floor) and ``bench_rank: N.Nx`` (batched / shared stems).

    python benchmarks/bench_rank.py                      # 16 facts x 8 candidates
    python benchmarks/bench_rank.py --shots 5            # 5 demonstrations per language
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

from smoke import add_smoke_flag, apply_smoke, bench_model  # noqa: E402

from mechlingo.activations.prefix import cache_upto, run_reads  # noqa: E402
from mechlingo.data import load_facts  # noqa: E402
from mechlingo.kernels.readout import token_logprobs  # noqa: E402
from mechlingo.scoring.rank import score_candidates  # noqa: E402


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


def demonstrations(facts: list, shots: int) -> list[str]:
    """Per fact, ``shots`` demonstrations of its language (the same for every fact of the
    language: bundled capitals not among the benchmark's facts), each ``prompt answer.``
    on its own line."""
    used = {f.id for f in facts}
    pool = [f for f in load_facts(langs=["en", "fr"], relations=["capital"], templates="natural")
            if f.id not in used]  # fmt: skip
    text = {lg: "".join(f"{d.prompt} {d.answer}.\n" for d in [f for f in pool if f.lang == lg][:shots])
            for lg in ("en", "fr")}  # fmt: skip
    return [text[f.lang] if shots else "" for f in facts]


def floor(
    model, facts, batch_size: int, clock=time.perf_counter, prefixes=None
) -> tuple[float, float]:
    """The shared-stem passes with no hook (the demonstrations once per language and pass,
    one row per fact, then the candidates' tails) and the reads (each scored token's
    log-probability: a logsumexp over the vocabulary), for the same batches: the seconds,
    and those of the reads alone."""
    from mechlingo.scoring import rank

    pre = prefixes or [""] * len(facts)
    layouts = [[rank.candidate_layout(model, f, c, p) for c in f.candidates]
               for f, p in zip(facts, pre, strict=True)]  # fmt: skip
    order = rank.batch_order(pre, layouts)  # the batches score_candidates runs
    layouts = [layouts[i] for i in order]
    reads_s = 0.0
    t0 = clock()
    for k in range(0, len(facts), batch_size):
        rows, reads, spans = rank._plan(layouts[k : k + batch_size], "sentence")
        batch = rank._rows_batch(model, rows)
        stems = rank._stem_lengths(rows, spans, batch.lengths)
        fact_of = torch.tensor([g for g, span in enumerate(spans) for _ in span])
        p_row = torch.tensor(stems)[fact_of]
        pad = rank._pad(model)
        stem_tok = torch.full((len(spans), max(stems)), pad, dtype=torch.long)
        for g, (span, n) in enumerate(zip(spans, stems, strict=True)):
            stem_tok[g, :n] = torch.tensor(rows[span[0]].ids[:n])
        r_idx, q_idx = torch.tensor(reads.row), torch.tensor(reads.pos)
        inside = q_idx < p_row[r_idx]
        stem_batch = rank.TokenBatch(stem_tok, torch.tensor(stems), pad, batch.has_bos)
        demos = rank._demo_groups(rows, spans, stems)
        if demos is not None:
            rec, a = rank._stems_on_demos(
                model, stem_batch, demos, fact_of[r_idx[inside]], q_idx[inside]
            )
        else:
            rec, a = run_reads(model, stem_batch, fact_of[r_idx[inside]], q_idx[inside])
        cache = cache_upto(model, rec, fact_of, max(stems))
        _, b = run_reads(model, batch, r_idx[~inside], q_idx[~inside], prefix=(cache, p_row))
        t1 = clock()
        token_logprobs(model, torch.cat([a, b]), torch.tensor(reads.target))
        reads_s += clock() - t1
    return clock() - t0, reads_s


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--facts", type=int, default=16, help="facts (default 16)")
    ap.add_argument("--candidates", type=int, default=8, help="candidates per fact (default 8)")
    ap.add_argument("--batch-size", type=int, default=16, help="facts per batched pass")
    ap.add_argument("--shots", type=int, default=0,
                    help="demonstrations before every query, the same per language (default 0)")  # fmt: skip
    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    apply_smoke(args, {"facts": 2, "candidates": 3, "batch_size": 2})
    torch.set_grad_enabled(False)
    model = bench_model(args, device=args.device)
    facts = cloze_facts(args.facts, args.candidates)
    n_sent = sum(len(f.candidates) for f in facts)
    dev = model.W_U.device
    # CPU seconds of this process on a CPU (one thread: the work done, however busy the
    # machine is); wall seconds on a GPU
    clock = time.process_time if dev.type == "cpu" else time.perf_counter

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

    pre = demonstrations(facts, args.shots)
    kw = {"batch_size": args.batch_size, "prefixes": pre}
    sync()
    t0 = clock()
    batched = score_candidates(model, facts, shared=False, **kw)
    sync()
    t_batched = clock() - t0
    t0 = clock()
    shared = score_candidates(model, facts, **kw)
    sync()
    t_shared = clock() - t0
    t_whole = None
    if args.shots:  # the shared-stem path before demonstrations were shared across facts
        from mechlingo.scoring import rank

        real, rank._demo_groups = rank._demo_groups, lambda *a: None
        try:
            t0 = clock()
            whole = score_candidates(model, facts, **kw)
            sync()
            t_whole = clock() - t0
        finally:
            rank._demo_groups = real
        gap_w = max(abs(a - b) for r, g in zip(whole.ce, shared.ce, strict=True)
                    for a, b in zip(r, g, strict=True))  # fmt: skip
        if gap_w > 1e-4:
            raise SystemExit("shared demonstrations and whole stems give different scores")
    t_floor, t_reads = floor(model, facts, args.batch_size, clock, pre)
    gap = max(abs(a - b) for r, g in zip(batched.ce, shared.ce, strict=True)
              for a, b in zip(r, g, strict=True))  # fmt: skip
    if not args.shots:
        t0 = clock()
        alone = one_by_one(model, facts)
        sync()
        t_alone = clock() - t0
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
    else:
        print(f"{len(facts)} facts x {args.candidates} candidates = {n_sent} sentences on {dev}, "
              f"{args.shots} demonstrations per language before each query: batched "
              f"{t_batched:.2f} s; each fact's stem whole (demonstrations included) "
              f"{t_whole:.2f} s")  # fmt: skip
        print(f"rank shared demonstrations vs whole stems: {t_whole / t_shared:.1f}x")
    print(f"shared stems ({shared.meta['path']}): {t_shared:.2f} s (max |difference| to "
          f"batched {gap:.1e}); floor {t_floor:.2f} s, of which the reads {t_reads:.2f} s "
          f"(any stem sharing is at most {t_batched / t_floor:.1f}x the batched path)")  # fmt: skip
    if gap > 1e-4:
        raise SystemExit("shared-stem and batched scores differ")
    print(f"bench_rank_floor: {t_shared / t_floor:.1f}x")
    print(f"bench_rank: {t_batched / t_shared:.1f}x")


if __name__ == "__main__":
    main()

"""Logit lens on 32 mixed-language prompts, three ways in one process.

1. mechlingo: one batched forward per 16 prompts (right-padded), only the last real token of
   each layer read, the unembedding done in chunks, no full-sequence logits.
2. TransformerLens 4's ``tools.analysis.logit_lens``, one prompt at a time (a padded batch read
   at position -1 would read padding for the shorter prompts), with the answer tokens as
   targets.
3. A per-layer Python loop: ``run_with_cache`` of every residual stream, then for each layer
   ln_final + unembedding of every position, then pick the last real token.

Prints the times, the ratios and the largest difference of the answers' log-probabilities;
then the floors measured in the same run (the unembedding GEMM at the lens's shape, and that
plus one bare forward) and, where nnterp is importable (``scripts/build_peer_envs.sh`` builds
its environment), nnterp's ``logit_lens`` over all layers, checked equal first.

Then the readout alone, on the same rows (the lens's residual rows of ``--readout-prompts``
prompts, every entry): :func:`mechlingo.kernels.readout.read_logits` (one pass over ``W_U``
gives the top-5, each track's set mass, primary log-probability and set rank) against the
cheapest composition of TransformerLens's ``logit_readout`` that gives the same numbers (it
takes one selector per call and single-token targets): a ``top_k`` call, a ``vocab`` call
over the union of the answer sets (set masses, primary log-probabilities, each set's best
token), and one per-row ``targets`` call per track (the rank of that best token). The last
line is ``mechlingo readout vs TransformerLens logit_readout: N.Nx`` (its time over ours).

Usage: python benchmarks/bench_lens.py [--n 32] [--device cpu|cuda] [--model PATH] [--clock cpu]

``--clock cpu`` times CPU seconds of the process (``time.process_time``) instead of wall time:
with one thread (``OMP_NUM_THREADS=1``) that is the work done whatever else runs on the
machine, so ratios measured on a shared machine stay comparable.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from smoke import add_smoke_flag, apply_smoke, bench_model, skipped

from mechlingo.activations.runs import collect
from mechlingo.analyses.decoders.lens import lens_hook_names, logit_lens
from mechlingo.core.answers import answer_tokens, pack_token_sets
from mechlingo.core.tokens import encode
from mechlingo.data import load_facts
from mechlingo.kernels.readout import Readout, final_logits, read_logits

_CLOCK = {"now": time.perf_counter}  # or time.process_time (--clock cpu)


def _best(fn, repeats: int):
    fn()  # warm-up
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = _CLOCK["now"]()
        out = fn()
        best = min(best, _CLOCK["now"]() - t0)
    return best, out


def tl_readout(model, rows: torch.Tensor, ids: torch.Tensor, k: int) -> Readout:
    """The numbers of ``read_logits(model, rows, ids, top_k=k)`` from TransformerLens's
    ``logit_readout``: top-k, a vocabulary-subset call, one per-row target call per track."""
    from transformer_lens.tools.analysis.logit_lens import logit_readout

    top = logit_readout(model, rows, top_k=k, return_type="log_probs")
    union, inverse = torch.unique(ids.clamp_min(0), return_inverse=True)
    sub = logit_readout(model, rows, vocab=union, return_type="log_probs").values
    members = torch.gather(sub[:, None, :].expand(-1, ids.shape[1], -1), 2, inverse)
    members = members.masked_fill(ids < 0, float("-inf"))  # [row, track, member] log-probs
    best = torch.gather(ids, 2, members.argmax(-1, keepdim=True))[..., 0]  # [row, track]
    ranks = [
        logit_readout(model, rows, targets=best[:, t], return_type="log_probs").target_ranks
        for t in range(ids.shape[1])
    ]
    return Readout(
        logsumexp=torch.full((rows.shape[0],), float("nan")),  # not given, not compared
        top_ids=top.top_ids,
        top_logprobs=top.values,
        set_logprob=torch.logsumexp(members, -1),
        primary_logprob=members[..., 0],
        set_rank=torch.cat(ranks, -1),
    )


def readout_comparison(model, facts, repeats: int) -> None:
    """read_logits against TransformerLens's logit_readout on the lens rows of ``facts``."""
    names = lens_hook_names(model, list(range(model.cfg.n_layers + 1)))
    acts = collect(model, encode(model, [f.prompt for f in facts]), names)
    rows = torch.cat([acts[n] for n in names])  # [entry * prompt, d_model]
    sets = [
        [answer_tokens(model, f.answer, lang=f.lang), answer_tokens(model, f.answer_en or f.answer)]
        for f in facts
    ]
    ids, primary = pack_token_sets(sets)
    ids, primary = ids.repeat(len(names), 1, 1), primary.repeat(len(names), 1)
    # the primary token first in each set, so TransformerLens's member 0 is the primary
    ids = torch.cat([primary[..., None], ids.masked_fill(ids == primary[..., None], -1)], -1)
    print(
        f"readout: {rows.shape[0]} rows ({len(facts)} prompts x {len(names)} entries), "
        f"2 tracks of up to {ids.shape[-1]} tokens, vocabulary {model.W_U.shape[1]}"
    )
    t_ours, ours = _best(lambda: read_logits(model, rows, ids, primary, top_k=5), repeats)
    t_tl, ref = _best(lambda: tl_readout(model, rows, ids, 5), repeats)
    for field in ("top_logprobs", "set_logprob", "primary_logprob"):
        d = (getattr(ours, field).cpu() - getattr(ref, field).cpu()).abs().max().item()
        print(f"  max |diff {field}| = {d:.2e}")
    same = torch.equal(ours.set_rank.cpu(), ref.set_rank.cpu())
    print(f"  set ranks equal: {same}; top ids equal: {torch.equal(ours.top_ids, ref.top_ids)}")
    t_top, _ = _best(lambda: read_logits(model, rows, top_k=5), repeats)

    def tl_top():
        from transformer_lens.tools.analysis.logit_lens import logit_readout

        return logit_readout(model, rows, top_k=5, return_type="log_probs")

    t_tl_top, _ = _best(tl_top, repeats)
    print(f"  top-5 only:    mechlingo {t_top:6.2f} s, logit_readout {t_tl_top:6.2f} s")
    print(f"  same numbers:  mechlingo {t_ours:6.2f} s, logit_readout x4 calls {t_tl:6.2f} s")
    print(f"mechlingo readout vs TransformerLens logit_readout: {t_tl / t_ours:.1f}x")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--device", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--readout-prompts", type=int, default=8)
    ap.add_argument("--skip-loop", action="store_true", help="leave out the per-layer loop")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="what is timed")
    add_smoke_flag(ap)
    args = apply_smoke(ap.parse_args(argv), {"n": 4, "repeats": 1, "readout_prompts": 2})
    _CLOCK["now"] = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_grad_enabled(False)
    model = bench_model(args, device=args.device)
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
    runs = [("mechlingo", ours), ("transformer_lens.logit_lens", tl), ("per-layer loop", loop)]
    for name, fn in runs[:2] if args.skip_loop else runs:
        best, out = _best(fn, args.repeats)
        results[name] = (best, out.cpu())
        print(f"{name:30s} {best:8.2f} s   (load {os.getloadavg()[0]:.1f}, {args.clock} clock)")
    base_t, base = results["mechlingo"]
    for name, (t, out) in results.items():
        if name == "mechlingo":
            continue
        diff = (out - base).abs().max().item()
        print(f"max |diff log-prob| vs {name} = {diff:.2e}")
        print(f"mechlingo lens vs {name}: {t / base_t:.1f}x")
    floors(model, prompts, base_t, args.repeats)
    peer_nnterp(model, prompts, primary, base_t, base, args)
    readout_comparison(model, facts[: args.readout_prompts], args.repeats)


def floors(model, prompts: list[str], t_lens: float, repeats: int) -> None:
    """The machine's floor for the lens, in this run: the unembedding GEMM at the lens's
    shape (prompts x entries rows by ``W_U``, float32), and that GEMM plus one bare batched
    forward to the final residual stream (no readout, one hook)."""
    n_rows = len(prompts) * (model.cfg.n_layers + 1)
    W = model.W_U.float()
    x = torch.randn(n_rows, W.shape[0], device=W.device)
    t_gemm, _ = _best(lambda: x @ W, repeats)
    name = lens_hook_names(model, [model.cfg.n_layers])[-1]
    batch = encode(model, prompts)
    t_fwd, _ = _best(lambda: collect(model, batch, [name]), repeats)
    print(
        f"floor: unembedding GEMM [{n_rows} x {W.shape[0]}] @ [{W.shape[0]} x {W.shape[1]}] "
        f"{t_gemm:.2f} s; + one bare forward {t_fwd:.2f} s"
    )
    print(f"lens over the unembedding GEMM (floor): {t_lens / t_gemm:.1f}x")
    print(f"lens over forward + GEMM (floor): {t_lens / (t_gemm + t_fwd):.1f}x")


def peer_nnterp(model, prompts, primary, t_lens: float, ours: torch.Tensor, args) -> None:
    """nnterp's ``logit_lens`` (on nnsight) over all layers, where nnterp is installed (its
    own environment: ``scripts/build_peer_envs.sh``); its answers' probabilities are checked
    against mechlingo's before the time counts."""
    if args.smoke:
        return skipped("nnterp (its own environment)")
    try:
        from nnterp import StandardizedTransformer
        from nnterp.interventions import logit_lens as nn_lens
    except ImportError as err:
        print(f"nnterp: not installed here ({err}); run scripts/build_peer_envs.sh and this "
              "benchmark with .venv-nnterp/bin/python for the peer")  # fmt: skip
        return
    from mechlingo.core.models import ensure_default_model

    folder = args.model or str(ensure_default_model())
    nn = StandardizedTransformer(folder, device_map="cpu", dtype=torch.float32)
    nn_lens(nn, prompts[:2])  # warm-up
    t_nn, probs = _best(lambda: nn_lens(nn, prompts), args.repeats)
    # [prompt, layer, vocab] probabilities after each layer; ours: [entry, prompt] log-probs
    # of entries 0..n (embedding, then after each layer): compare after each layer
    # compared as probabilities: nnterp's float32 softmax underflows to 0 (log -inf) for
    # answers far down an early layer's distribution, where mechlingo keeps the log-prob
    got = torch.stack([probs[i, :, t] for i, t in enumerate(primary)], 1).float()
    mine = ours[1:].float().exp()
    diff = (got - mine).abs().max().item()
    both = (got > 1e-20) & (mine > 1e-20)
    d_log = (got[both].log() - mine[both].log()).abs().max().item()
    print(f"nnterp logit_lens: {t_nn:.2f} s, output {tuple(probs.shape)}; max |diff prob| vs "
          f"mechlingo {diff:.2e}, max |diff log-prob| where both > 1e-20 {d_log:.2e}")  # fmt: skip
    if diff > 1e-4 or d_log > 1e-2:
        raise SystemExit("nnterp and mechlingo disagree: not timed")
    print(f"mechlingo lens vs nnterp logit_lens: {t_nn / t_lens:.1f}x")


if __name__ == "__main__":
    main()

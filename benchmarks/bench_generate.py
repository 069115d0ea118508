"""Benchmark: KV-cached greedy generation vs recomputing the prefix vs transformers.

One process, the same prompts (``--n`` mixed-language prompts from the bundled facts, eight
languages) and ``--new`` new tokens, three ways:

* ``mechlingo cached`` -- :func:`mechlingo.scoring.evaluate.greedy_generate` (default ``cache=True``):
  one prompt pass per batch, then one token per row per step over the transformers cache,
  through the TransformerLens bridge with its hooks in place;
* ``mechlingo uncached`` -- the same call with ``cache=False``: the whole prefix is recomputed
  at every step (the decoder mechlingo used before);
* ``transformers generate`` -- a plain transformers model loaded from the same folder (no
  bridge, no hook points), its own ``generate`` (greedy, KV cache, left padding). The
  bridge's wrapped model cannot serve here: its attention components never fill the cache
  under transformers 5, so ``original_model.generate`` gives wrong tokens.

The default cached decoding takes its arg-max where a one-off timing found it cheaper (the
bfloat16 screen or the plain float32 arg-max, :func:`mechlingo.kernels.readout.screen_choice`);
it is also timed with each forced (``screening(True)``, ``screening(False)``), and the three
must give the same tokens. All three decode exactly ``--new`` tokens (no stop at a line break, so each does the same
work); a second pair of lines times mechlingo with its default stop at the first line break,
which lets finished rows leave the cached batch. The floor, in the same run: bare one-token
forward steps of the plain transformers model over its KV cache with an arg-max
(:func:`bare_steps`; ``cached decoding over bare forward steps (floor): N.Nx``). mechlingo
cached and uncached must give the same tokens (checked); the agreement with transformers is
printed. The last lines are the speed-ups of the default cached decoding over its
alternatives: ``cached vs uncached: N.Nx`` and, last, ``cached vs transformers generate:
N.Nx``.

    python benchmarks/bench_generate.py                 # 128 prompts x 8 tokens, batch 32
    python benchmarks/bench_generate.py --n 32 --new 4  # quicker
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

from mechlingo.activations.decoding import kv_cache_path  # noqa: E402
from mechlingo.data import load_facts  # noqa: E402
from mechlingo.kernels.readout import screen_choice, screening  # noqa: E402
from mechlingo.scoring.evaluate import (
    DecodeOptions,
    greedy_generate,  # noqa: E402
)

LANGS = ["en", "fr", "de", "es", "ru", "ja", "zh", "ar"]


def prompts_for(n: int) -> list[str]:
    per = -(-n // len(LANGS))
    facts = load_facts(langs=LANGS, relations=["capital"], limit=per)
    by_lang = {lg: [f.prompt for f in facts if f.lang == lg] for lg in LANGS}
    mixed = [p for group in zip(*by_lang.values(), strict=False) for p in group]
    return mixed[:n]


def plain_hf_model(name: str | None):
    """The same weights as a plain transformers model (float32, CPU)."""
    from transformers import AutoModelForCausalLM

    from mechlingo.core.models import ensure_default_model

    folder = ensure_default_model() if name is None else name
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def left_padded(tok, prompts: list[str], batch_size: int):
    """The tokenizer's encodings of ``prompts``, ``batch_size`` at a time, left-padded (as
    transformers generates); the tokenizer's padding side is restored afterwards."""
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        for i in range(0, len(prompts), batch_size):
            yield tok(prompts[i : i + batch_size], return_tensors="pt", padding=True)
    finally:
        tok.padding_side = side


def hf_generate(hf, tok, prompts: list[str], new: int, batch_size: int) -> list[str]:
    """transformers ``generate``, greedy, left-padded."""
    out = []
    for enc in left_padded(tok, prompts, batch_size):
        gen = hf.generate(
            **enc,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
        out += tok.batch_decode(gen[:, enc["input_ids"].shape[1] :])
    return out


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded gemma-3-270m)")
    ap.add_argument("--n", type=int, default=128, help="prompts (default 128)")
    ap.add_argument("--new", type=int, default=8, help="new tokens (default 8)")
    ap.add_argument("--batch-size", type=int, default=32)
    add_smoke_flag(ap)
    args = apply_smoke(ap.parse_args(argv), {"n": 4, "new": 2, "batch_size": 2})
    torch.set_grad_enabled(False)
    model = bench_model(args, device="cpu")
    prompts = prompts_for(args.n)
    print(f"{len(prompts)} prompts, {args.new} new tokens, batch {args.batch_size}, ", end="")
    print(f"KV-cache path: {kv_cache_path(model)}, torch threads {torch.get_num_threads()}")
    hf = plain_hf_model(args.model)
    greedy_generate(model, prompts[:4], decoding=DecodeOptions(max_new_tokens=2))  # warm up
    hf_generate(hf, model.tokenizer, prompts[:4], 2, 4)

    dec = DecodeOptions(max_new_tokens=args.new, batch_size=args.batch_size)
    cached, t_cached = timed(
        lambda: greedy_generate(model, prompts, stop_at_newline=False, decoding=dec)
    )
    plain, t_plain = timed(
        lambda: greedy_generate(
            model, prompts, stop_at_newline=False, decoding=replace(dec, cache=False)
        )
    )
    hf_out, t_hf = timed(
        lambda: hf_generate(hf, model.tokenizer, prompts, args.new, args.batch_size)
    )
    with screening(False):
        fp32, t_fp32 = timed(
            lambda: greedy_generate(model, prompts, stop_at_newline=False, decoding=dec)
        )
    with screening(True):
        bf16, t_bf16 = timed(
            lambda: greedy_generate(model, prompts, stop_at_newline=False, decoding=dec)
        )
    choice = {True: "the bf16 screen", False: "the plain float32 arg-max"}.get(
        screen_choice(model), "the plain float32 arg-max (no screen on this device)"
    )
    stop_c, t_stop_c = timed(lambda: greedy_generate(model, prompts, decoding=dec))
    stop_u, t_stop_u = timed(
        lambda: greedy_generate(model, prompts, decoding=replace(dec, cache=False))
    )

    same = sum(a == b for a, b in zip(cached, plain, strict=True))
    same_stop = sum(a == b for a, b in zip(stop_c, stop_u, strict=True))
    same_hf = sum(a == b for a, b in zip(cached, hf_out, strict=True))
    print(f"mechlingo cached:     {t_cached:7.2f} s (its arg-max, measured once: {choice})")
    print(f"mechlingo uncached:   {t_plain:7.2f} s")
    print(f"transformers generate:{t_hf:7.2f} s (no hooks)")
    print(f"mechlingo cached, plain float32 arg-max: {t_fp32:.2f} s; bf16 screen (where it "
          f"applies): {t_bf16:.2f} s")  # fmt: skip
    print(f"with line-break stops: cached {t_stop_c:.2f} s, uncached {t_stop_u:.2f} s")
    print(f"cached == uncached: {same}/{len(prompts)}; with stops {same_stop}/{len(prompts)}")
    print(f"cached == transformers generate: {same_hf}/{len(prompts)}")
    same_fp32 = sum(a == b == c for a, b, c in zip(cached, fp32, bf16, strict=True))
    print(f"default == plain arg-max == screened: {same_fp32}/{len(prompts)}")
    if same != len(prompts) or same_stop != len(prompts) or same_fp32 != len(prompts):
        raise SystemExit("cached and uncached decoding disagree")
    floor_out, t_floor = timed(
        lambda: bare_steps(hf, model.tokenizer, prompts, args.new, args.batch_size)
    )
    same_floor = sum(a == b for a, b in zip(floor_out, hf_out, strict=True))
    print(f"floor (bare forward steps, KV cache, arg-max): {t_floor:.2f} s; "
          f"== transformers generate {same_floor}/{len(prompts)}")  # fmt: skip
    print()
    print(f"cached decoding over bare forward steps (floor): {t_cached / t_floor:.1f}x")
    print(f"bf16 screen vs plain arg-max (cached): {t_fp32 / t_bf16:.1f}x")
    print(f"cached vs uncached (line-break stops): {t_stop_u / t_stop_c:.1f}x")
    print(f"cached vs uncached: {t_plain / t_cached:.1f}x")
    print(f"cached vs transformers generate: {t_hf / t_cached:.1f}x")


def bare_steps(hf, tok, prompts: list[str], new: int, batch_size: int) -> list[str]:
    """The floor of greedy decoding: per batch one prompt forward, then ``new - 1`` bare
    one-token forward steps over the transformers KV cache and an arg-max (no hooks, no
    ``generate`` bookkeeping, no stopping rule)."""
    out = []
    for enc in left_padded(tok, prompts, batch_size):
        mask = enc["attention_mask"]
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        res = hf(**enc, position_ids=pos, use_cache=True)
        nxt = res.logits[:, -1].argmax(-1, keepdim=True)
        toks = [nxt]
        for _ in range(new - 1):
            mask = torch.cat([mask, torch.ones_like(nxt)], -1)
            pos = pos[:, -1:] + 1
            res = hf(input_ids=nxt, attention_mask=mask, position_ids=pos,
                     past_key_values=res.past_key_values, use_cache=True)  # fmt: skip
            nxt = res.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(nxt)
        out += tok.batch_decode(torch.cat(toks, -1))
    return out


if __name__ == "__main__":
    main()

"""Measure the per-item CPU costs of :data:`mechlingo.core.costs.SECONDS_PER_ITEM` on the
embedded model and print the table to paste there (with the date and the machine).

Each operation is timed in CPU seconds (``time.process_time``, so other jobs on the machine do
not inflate it) on the public function the commands call, after one warm-up call,
the median of ``--repeats`` runs::

    OMP_NUM_THREADS=1 python scripts/measure_costs.py --repeats 1
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import mechlingo.data
from mechlingo.analyses.decoders.lens import lens_facts, logit_lens
from mechlingo.analyses.decoders.options import TrainingOptions
from mechlingo.analyses.decoders.tuned_lens import train_tuned_lens
from mechlingo.core.models import load_model
from mechlingo.data import load_facts, read_parallel_dir
from mechlingo.scoring.evaluate import DecodeOptions, greedy_generate


def _median(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def _lens_costs(model: Any, per_lang: int, repeats: int) -> tuple[float, float]:
    """CPU seconds of ``lens_read`` (one fact read by ``lens_facts`` at every layer, batch 16)
    and of ``lens_position`` (one token position of the token-level lens, ``logit_lens``
    without answers) on ``per_lang`` facts of 5 languages and their prompts."""
    facts = load_facts(langs=["en", "fr", "de", "es", "ja"], limit=per_lang)
    t_read = _median(lambda: lens_facts(model, facts, track_langs=["en"]), repeats) / len(facts)
    texts = [f.prompt for f in facts[:: max(1, len(facts) // 20)]][:20]
    positions = sum(len(model.to_tokens(t, prepend_bos=True)[0]) for t in texts)
    t_pos = _median(lambda: logit_lens(model, texts), repeats) / positions
    return t_read, t_pos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--lens-facts", type=int, default=20, help="facts per language of the lens_read row"
    )
    args = ap.parse_args()
    model = load_model(None)
    prompts = [f.prompt for f in load_facts(langs=["en", "fr", "de", "es"], limit=8)][:16]
    n = len(prompts)
    print(f"{n} prompts", flush=True)
    t1 = _median(
        lambda: greedy_generate(
            model, prompts, decoding=DecodeOptions(max_new_tokens=1, batch_size=16)
        ),
        args.repeats,
    )
    t8 = _median(
        lambda: greedy_generate(
            model, prompts, decoding=DecodeOptions(max_new_tokens=8, batch_size=16)
        ),
        args.repeats,
    )
    texts = read_parallel_dir(Path(mechlingo.data.__file__).parent / "ntrex")
    sents = texts["en"][:16]
    tokens = model.to_tokens(sents[:16], prepend_bos=True)
    with torch.no_grad():
        t_sent = _median(lambda: model(tokens), args.repeats) / 16
        print(f"prompt/token/sentence: {t1:.2f} {t8:.2f} {t_sent:.4f}", flush=True)
        copies = model.to_tokens([prompts[0]] * 64, prepend_bos=True)
        t_cell = _median(lambda: model(copies), args.repeats) / 64
    print(f"patch_cell: {t_cell:.5f}", flush=True)
    t_step = (
        _median(lambda: train_tuned_lens(model, sents, TrainingOptions(steps=2, max_tokens=48)), 1)
        / 2
    )
    t_read, t_pos = _lens_costs(model, args.lens_facts, args.repeats)
    print(f"lens_read/lens_position: {t_read:.4f} {t_pos:.4f}", flush=True)
    table = {
        "prompt": round(t1 / n, 4),
        "token": round((t8 - t1) / (7 * n), 4),
        "patch_cell": round(t_cell, 5),
        "sentence": round(t_sent, 4),
        "lens_step": round(t_step, 3),
        "lens_read": round(t_read, 4),
        "lens_position": round(t_pos, 4),
    }
    print("SECONDS_PER_ITEM =", table)
    print(
        "MEASURED_ON =",
        {
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.processor() or platform.system()}",
            "threads": torch.get_num_threads(),
            "model": "google/gemma-3-270m (embedded)",
        },
    )


if __name__ == "__main__":
    main()

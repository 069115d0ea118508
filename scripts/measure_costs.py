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

import torch

import mechlingo.data
from mechlingo.analyses.decoders.tuned_lens import train_tuned_lens
from mechlingo.core.models import load_model
from mechlingo.data import load_facts, read_parallel_dir
from mechlingo.scoring.evaluate import greedy_generate


def _median(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model = load_model(None)
    prompts = [f.prompt for f in load_facts(langs=["en", "fr", "de", "es"], limit=8)][:16]
    n = len(prompts)
    print(f"{n} prompts", flush=True)
    t1 = _median(
        lambda: greedy_generate(model, prompts, max_new_tokens=1, batch_size=16), args.repeats
    )
    t8 = _median(
        lambda: greedy_generate(model, prompts, max_new_tokens=8, batch_size=16), args.repeats
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
    t_step = _median(lambda: train_tuned_lens(model, sents, steps=2, max_tokens=48), 1) / 2
    table = {
        "prompt": round(t1 / n, 4),
        "token": round((t8 - t1) / (7 * n), 4),
        "patch_cell": round(t_cell, 5),
        "sentence": round(t_sent, 4),
        "lens_step": round(t_step, 3),
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

"""``mechlingo eval``: accuracy per language (greedy, klar or candidate rank), with Wilson
intervals."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from mechlingo.cli.common import (
    add_data_args,
    add_metric_args,
    add_model_args,
    add_out_arg,
    command,
    load_cli_model,
    load_selected_facts,
    run_meta,
    scorer_from_args,
)
from mechlingo.kernels.significance import wilson_table
from mechlingo.report import write_outputs
from mechlingo.report.evaluate import eval_report
from mechlingo.scoring.evaluate import evaluate_facts


def _eval_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_data_args(p)
    add_out_arg(p)
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=8,
        help="greedy tokens to generate (default 8; --metric klar always decodes 10)",
    )
    add_metric_args(p)


@command("eval", "accuracy per language: greedy (default), klar or candidate rank", _eval_args)
def cmd_eval(args: Any) -> int:

    facts = load_selected_facts(args)
    scorer = scorer_from_args(args)
    model = load_cli_model(args)
    t0 = time.time()
    result = evaluate_facts(
        model,
        facts,
        metric=scorer,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        progress=not args.quiet,
    )

    summary = {
        "metric": scorer.to_dict(),
        "accuracy": result.accuracy(),
        "accuracy_ci": _accuracy_ci(result.records),
        "answered_in_english": result.english_rate(),
        "skipped": result.skipped,
        **result.metric_summary(),
        "meta": run_meta(
            model,
            args,
            n_facts=len(facts),
            max_new_tokens=args.max_new_tokens,
            seconds=round(time.time() - t0, 1),
        ),
    }
    lines = [json.dumps(r, ensure_ascii=False) for r in result.records]
    write_outputs(
        args.out,
        {
            "summary.json": summary,
            "generations.jsonl": "\n".join(lines) + "\n",
            "report.html": eval_report(result.records, summary),
        },
    )
    ci = summary["accuracy_ci"]
    for lg, x in summary["accuracy"].items():
        print(f"{lg}: {x:.3f} [{ci[lg]['lo']:.3f}, {ci[lg]['hi']:.3f}] (n={ci[lg]['n']})")
    for why, n in result.skipped.items():
        print(f"skipped {n} record(s) under --metric {scorer.metric}: {why}")
    print(f"wrote {args.out}/summary.json, generations.jsonl and report.html")
    return 0


def _accuracy_ci(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Wilson 95% interval of the accuracy of each language (``p``, ``lo``, ``hi``)."""
    by_lang: dict[str, list[bool]] = {}
    for r in records:
        by_lang.setdefault(r["lang"], []).append(bool(r["correct"]))
    return wilson_table({"accuracy": dict(sorted(by_lang.items()))})["accuracy"]

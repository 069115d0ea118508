"""``mechlingo eval``: accuracy per language (greedy, klar or candidate rank), with Wilson
intervals (:func:`mechlingo.scoring.accuracy.run_eval`)."""

from __future__ import annotations

import argparse
import time

from mechlingo.cli import common, cost
from mechlingo.cli.streams import outputs_written
from mechlingo.report.evaluate import eval_report
from mechlingo.scoring.accuracy import run_eval


def _eval_args(p: argparse.ArgumentParser) -> None:
    common.add_model_args(p)
    common.add_data_args(p)
    common.add_out_arg(p)
    common.add_max_new_tokens_arg(p, note="--metric klar always decodes 10")
    common.add_metric_args(p)
    cost.add_dry_run_arg(p)


@common.command(
    "eval", "accuracy per language: greedy (default), klar or candidate rank", _eval_args
)
def cmd_eval(args: argparse.Namespace) -> int:

    facts = common.load_selected_facts(args)
    scorer = common.scorer_from_args(args)
    plan = cost.plan_eval(facts, scorer.metric, args.max_new_tokens, args.model)
    if cost.announce(plan, args):
        return 0
    model = common.load_cli_model(args, facts=facts)
    t0 = time.time()
    run = run_eval(
        model,
        facts,
        scorer,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        progress=not args.quiet,
    )
    meta = common.run_meta(
        model,
        args,
        n_facts=len(facts),
        max_new_tokens=args.max_new_tokens,
        seconds=round(time.time() - t0, 1),
    )
    summary = run.summary(meta)
    run.write(args.out, meta=meta, extra={"report.html": eval_report(run.result.records, summary)})
    outputs_written()
    ci = summary["accuracy_ci"]
    for lg, x in summary["accuracy"].items():
        print(f"{lg}: {x:.3f} [{ci[lg]['lo']:.3f}, {ci[lg]['hi']:.3f}] (n={ci[lg]['n']})")
    for why, n in run.result.skipped.items():
        print(f"skipped {n} record(s) under --metric {scorer.metric}: {why}")
    print(f"wrote {args.out}/summary.json, generations.jsonl and report.html")
    return 0

"""``mechlingo lens`` and ``mechlingo eval``: the per-language logit lens and greedy accuracy."""

from __future__ import annotations

import argparse
import time
from typing import Any

from mechlingo.analyses.evaluate import evaluate_facts
from mechlingo.analyses.lens import lens_facts
from mechlingo.cli.common import (
    UsageError,
    add_data_args,
    add_model_args,
    add_out_arg,
    command,
    load_cli_model,
    load_selected_facts,
    run_meta,
    split_list,
)
from mechlingo.kernels.significance import wilson_table
from mechlingo.report import Report, write_outputs
from mechlingo.viz.common import accuracy_bars


def _lens_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_data_args(p)
    add_out_arg(p)
    p.add_argument(
        "--track",
        default="en",
        help="extra languages whose answers to track besides the prompt's own (default en)",
    )
    p.add_argument(
        "--max-rank",
        type=int,
        default=10,
        help="rank counted as 'decodable' in the summary (default 10)",
    )


@command("lens", "per-language logit lens and latent-language curves", _lens_args)
def cmd_lens(args: Any) -> int:

    facts = load_selected_facts(args)
    model = load_cli_model(args)
    track = split_list(args.track) or []
    t0 = time.time()
    try:
        result = lens_facts(
            model, facts, track_langs=track, batch_size=args.batch_size, progress=not args.quiet
        )
    except ValueError as err:
        raise UsageError(str(err)) from err
    summary = result.summary(max_rank=args.max_rank)
    summary["meta"] = run_meta(model, args, n_facts=len(facts), seconds=round(time.time() - t0, 1))
    report = Report("mechlingo: per-language logit lens", summary["meta"])
    report.add_text(
        "Each prompt's residual stream at its last token is decoded after every layer through "
        "the final norm and unembedding. Curves show the probability of the answer in the "
        "prompt's language and in the tracked languages. A rise of the English answer in the "
        "middle layers before the prompt-language answer is the English pivot.",
        note=True,
    )
    report.add_heading("Summary")
    report.add_table(
        [
            {
                "lang": lg,
                "prompts": summary["n_prompts"][lg],
                "final-layer top-1 accuracy": summary["final_layer_accuracy"].get(lg, 0.0),
                f"English answer rank <= {args.max_rank} before the last layer": summary[
                    "english_decodable_before_last"
                ].get(lg, 0.0),
            }
            for lg in summary["n_prompts"]
        ]
    )
    report.add_heading("Latent-language curves")
    report.add_figure(result.fig_latent_curves())
    if "en" in result.tracks:
        report.add_heading("English answer rank per layer and prompt")
        report.add_figure(result.fig_heatmap("en", "rank"))
    report.add_heading("Prompt-language answer rank per layer and prompt")
    report.add_figure(result.fig_heatmap("answer", "rank"))
    df = result.to_dataframe()
    write_outputs(
        args.out,
        {
            "summary.json": summary,
            "lens.csv": df.to_csv(index=False),
            "report.html": report,
        },
    )
    print(f"wrote {args.out}/summary.json, lens.csv and report.html")
    return 0


def _eval_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_data_args(p)
    add_out_arg(p)
    p.add_argument(
        "--max-new-tokens", type=int, default=8, help="greedy tokens to generate (default 8)"
    )


@command("eval", "greedy-generation accuracy per language (the baseline)", _eval_args)
def cmd_eval(args: Any) -> int:

    facts = load_selected_facts(args)
    model = load_cli_model(args)
    t0 = time.time()
    result = evaluate_facts(
        model,
        facts,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        progress=not args.quiet,
    )

    by_lang: dict[str, list[bool]] = {}
    for r in result.records:
        by_lang.setdefault(r["lang"], []).append(bool(r["correct"]))
    ci = wilson_table({"accuracy": dict(sorted(by_lang.items()))})["accuracy"]
    summary = {
        "accuracy": result.accuracy(),
        "accuracy_ci": ci,
        "answered_in_english": result.english_rate(),
        "meta": run_meta(
            model,
            args,
            n_facts=len(facts),
            max_new_tokens=args.max_new_tokens,
            seconds=round(time.time() - t0, 1),
        ),
    }
    report = Report("mechlingo: greedy accuracy", summary["meta"])
    report.add_text(
        "Correct = the greedy continuation starts with the answer or an alias after "
        "normalisation (case, whitespace, leading punctuation; word boundary in languages "
        "written with spaces).",
        note=True,
    )

    report.add_figure(
        accuracy_bars(
            {"accuracy": summary["accuracy"]},
            "Greedy accuracy per language (Wilson 95% intervals)",
            {"accuracy": ci},
        )
    )
    report.add_table([{"lang": lg, **c} for lg, c in ci.items()])
    report.add_heading("Generations")
    report.add_table(
        result.records[:300], ["lang", "id", "prompt", "answer", "generation", "correct"]
    )
    write_outputs(
        args.out,
        {
            "summary.json": summary,
            "generations.jsonl": "\n".join(
                __import__("json").dumps(r, ensure_ascii=False) for r in result.records
            )
            + "\n",
            "report.html": report,
        },
    )
    for lg, x in summary["accuracy"].items():
        print(f"{lg}: {x:.3f} [{ci[lg]['lo']:.3f}, {ci[lg]['hi']:.3f}]")
    print(f"wrote {args.out}/summary.json, generations.jsonl and report.html")
    return 0

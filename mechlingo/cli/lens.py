"""``mechlingo lens``: the per-language logit lens (``--decoder`` for the other decoders)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from mechlingo.analyses.decoders.lens import lens_facts
from mechlingo.cli import common
from mechlingo.cli.decoders import add_decoder_args, parse_decoders, run_decoders
from mechlingo.report import write_outputs
from mechlingo.report.lens import lens_report


def _lens_args(p: argparse.ArgumentParser) -> None:
    common.add_model_args(p)
    common.add_data_args(p)
    common.add_out_arg(p)
    p.add_argument(
        "--track",
        default="en",
        help="extra languages whose answers to track besides the prompt's own (default en)",
    )
    common.add_max_rank_arg(p, "rank counted as 'decodable' in the summary")
    add_decoder_args(p)


@common.command("lens", "per-language logit lens and latent-language curves", _lens_args)
def cmd_lens(args: Any) -> int:

    decoders = parse_decoders(args)
    facts = common.load_selected_facts(args)
    model = common.load_cli_model(args)
    track = common.split_list(args.track) or []
    if decoders != ["logit"]:
        return run_decoders(args, model, facts, decoders, track)
    t0 = time.time()
    with common.usage_errors(ValueError):
        result = lens_facts(
            model, facts, track_langs=track, batch_size=args.batch_size, progress=not args.quiet
        )
    summary = result.summary(max_rank=args.max_rank)
    summary["meta"] = common.run_meta(
        model, args, n_facts=len(facts), seconds=round(time.time() - t0, 1)
    )
    report = lens_report(result, summary, max_rank=args.max_rank)
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

"""``mechlingo lens``: the per-language logit lens (``--decoder`` for the other decoders);
with ``--prompt TEXT`` the token-level lens of any prompt (every position, every layer)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from mechlingo.analyses.decoders.lens import lens_facts, logit_lens
from mechlingo.analyses.decoders.registry import default_decoder
from mechlingo.cli import common, cost
from mechlingo.cli.decoders import (
    DecoderChoice,
    add_decoder_args,
    build_decoders,
    decoder_choice,
    run_decoders,
)
from mechlingo.cli.glossary import about
from mechlingo.cli.streams import outputs_written
from mechlingo.core.errors import InputError
from mechlingo.core.inert import inert_csv
from mechlingo.data import Fact, benchmark_format, read_facts
from mechlingo.data.fact_answers import fact_answers
from mechlingo.data.langid import identify_language
from mechlingo.report import write_outputs
from mechlingo.report.lens import lens_report, token_lens_report


def _lens_args(p: argparse.ArgumentParser) -> None:
    common.add_model_args(p)
    common.add_data_args(p)
    common.add_out_arg(p)
    p.add_argument("--track", default="en", help=about("--track", "'' tracks none"))
    common.add_max_rank_arg(p)
    p.add_argument("--prompt", action="append", default=None, help=about("--prompt", "instead "
                   "of the facts (default: none, the facts are read); repeat for several: the top tokens of every layer, their "
                   "probabilities and languages (tokens.json and the grid in report.html); "
                   "--langs, --relation and --track are then unused"))  # fmt: skip
    add_decoder_args(p)
    cost.add_dry_run_arg(p)


def answer_pool(args: argparse.Namespace, facts: list[Fact]) -> list[Fact]:
    """Where tracked answers are looked up: every row of a ``--facts`` file (also those of
    languages ``--langs`` leaves out), else the selected facts."""
    if args.facts is None or benchmark_format(args.facts) is not None:
        return facts
    return read_facts(args.facts)


def check_track_answers(
    facts: Sequence[Fact], track: Sequence[str], pool: Sequence[Fact] | None = None
) -> None:
    """Every tracked language needs each fact's answer in it (a row of the same id in
    ``pool`` or the bundled data; English also ``answer_en``): refused before the model
    loads, in flags."""
    for lg in track:
        try:
            fact_answers(facts, [lg], pool)
        except InputError as err:
            raise common.UsageError(
                f"--track {lg}: {err.message.split(':')[0]} (the lens tracks each fact's "
                f"answer in {lg})",
                where="--track",
                fix=f"add {lg} rows with the same ids to --facts"
                + (" (or an 'answer_en' field)" if lg == "en" else "")
                + f", or leave {lg} out of --track (--track '' tracks none)",
            ) from None


@common.command("lens", "per-language logit lens and latent-language curves", _lens_args)
def cmd_lens(args: argparse.Namespace) -> int:

    choice = decoder_choice(args)
    if args.prompt:
        return _token_lens(args, choice)
    facts = common.load_selected_facts(args)
    alone = choice.labels == [default_decoder()]
    pool = answer_pool(args, facts) if alone else facts
    check_track_answers(facts, common.split_list(args.track) or [], pool)
    plan = cost.plan_lens(facts, choice.uses, model=args.model)
    if cost.announce(plan, args):
        return 0
    model = common.load_cli_model(args, facts=facts)
    track = common.split_list(args.track) or []
    if not alone:
        return run_decoders(args, model, facts, choice, track)
    t0 = time.time()
    with common.usage_errors(ValueError):
        result = lens_facts(
            model, facts, track_langs=track, batch_size=args.batch_size,
            progress=not args.quiet, pool=pool,
        )  # fmt: skip
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
            "lens.csv": inert_csv(df),
            "report.html": report,
        },
    )
    outputs_written()
    print(f"wrote {args.out}/summary.json, lens.csv and report.html")
    return 0


def _token_lens(args: argparse.Namespace, choice: DecoderChoice) -> int:
    """``--prompt``: the token-level lens of each prompt under one decoder: ``tokens.json``
    (per prompt, per layer and position, the top tokens with probabilities and languages),
    ``summary.json`` and ``report.html`` (the grids)."""
    if len(choice.uses) != 1:
        raise common.UsageError("--prompt reads one decoder at a time", where="--decoder",
                                fix="give one name (one --tuned-lens folder)")  # fmt: skip
    if any(not p.strip() for p in args.prompt):
        raise common.UsageError("--prompt is empty", fix="give the text to read")
    plan = cost.plan_lens([], choice.uses, prompts=args.prompt, model=args.model)
    if cost.announce(plan, args):
        return 0
    model = common.load_cli_model(args)
    label = choice.labels[0]
    # the chosen decoder with its options, built from the registry like the facts' lens
    decoder = build_decoders(model, choice.uses)[label]
    langs = [identify_language(p) or "en" for p in args.prompt]
    t0 = time.time()
    with common.usage_errors(ValueError):
        result = logit_lens(model, args.prompt, langs=langs, decoder=decoder,
                            batch_size=args.batch_size, progress=not args.quiet)  # fmt: skip
    assert result.tokens is not None
    meta = common.run_meta(model, args, n_prompts=len(args.prompt), decoder=label,
                           seconds=round(time.time() - t0, 1))  # fmt: skip
    summary = {"prompts": args.prompt, "langs": langs, "layers": result.layers,
               "top1": [result.tokens.top1(p) for p in range(len(args.prompt))], "meta": meta}  # fmt: skip
    write_outputs(
        args.out,
        {"summary.json": summary, "tokens.json": result.tokens.to_json(),
         "report.html": token_lens_report(result, meta)},
    )  # fmt: skip
    outputs_written()
    print(f"wrote {args.out}/summary.json, tokens.json and report.html")
    return 0

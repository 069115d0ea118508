"""``mechlingo steer build`` and ``mechlingo steer eval``: the two repair vectors on the CLI.

``steer build --out VDIR`` builds the recall-engagement (task) and back-translation (diff)
vector stacks from the *build* split of the selected facts (by default every bundled relation,
balanced) and saves them. ``steer eval --vectors VDIR --out DIR`` runs the protocol of
:func:`mechlingo.analyses.recall.steer_eval.run_steer_eval` (headroom, the dev sweep, the
lowest language, the test conditions and their controls; ``--transfer``: the transfer matrix
of :mod:`mechlingo.analyses.recall.transfer`) and writes ``summary.json``,
``generations.jsonl`` and ``report.html``, resumable (:mod:`mechlingo.cli.work`). Both use the
``natural`` templates split by fact id into build/dev/test. Entry points: :func:`cmd_steer`,
:func:`build_options_from_args`, :func:`eval_options_from_args`.
``docs/methods/repair-vectors.md`` has the protocol and measured runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from mechlingo.analyses.recall import steer_eval, steering, transfer
from mechlingo.analyses.recall.group_vectors import balance_relations
from mechlingo.analyses.recall.settings import (
    BuildSettings,
    DevGrid,
    MatrixSettings,
    ScoringOptions,
    SplitSettings,
)
from mechlingo.analyses.recall.steer_eval import SteerEvalOptions
from mechlingo.analyses.recall.steering import SteeringConfig, SteeringPair
from mechlingo.cli import common, cost
from mechlingo.cli.experts import add_side_effects_lines_arg
from mechlingo.cli.flags import parse_config, parse_floats, parse_ints
from mechlingo.cli.glossary import about
from mechlingo.cli.streams import outputs_written
from mechlingo.cli.work import (
    add_work_args,
    data_key,
    finish_checkpoints,
    hash_files,
    open_checkpoints,
    work_folder,
)
from mechlingo.core.artifacts import atomic_folder

# build_steering_vectors, run_steer_eval and transfer_matrices are called through their modules, so
# that a wrapper set on the module (a test's monkeypatch, a user's instrumentation) sees every
# call.
from mechlingo.core.distributed import sharded_scoring
from mechlingo.core.types import Model
from mechlingo.data import read_parallel_dir
from mechlingo.data.splits import split_facts
from mechlingo.interventions import ModelMismatchError
from mechlingo.report import write_outputs
from mechlingo.report.steer import repair_report, transfer_report

# The flags' defaults are the settings classes' (each default written once, there).
_BUILD, _GRID, _SCORING = BuildSettings(), DevGrid(), ScoringOptions()
_SPLIT, _MATRIX = SplitSettings(), MatrixSettings()


def _flag_text(values: Sequence[object]) -> str:
    """A default tuple as the comma-separated text of its flag."""
    return ",".join(map(str, values))


def _fractions(text: str) -> tuple[float, float, float]:
    vals = parse_floats(text, "--split") or []
    if len(vals) != 3 or abs(sum(vals) - 1) > 1e-6 or min(vals) < 0:
        raise common.UsageError(
            f"--split takes three fractions summing to 1 (build,dev,test), got {text}"
        )
    return vals[0], vals[1], vals[2]


DEFAULT_SPLIT = _flag_text(_SPLIT.fractions)


def _common(p: argparse.ArgumentParser, *, report: bool) -> None:
    common.add_model_args(p)
    common.add_data_args(p)
    common.add_out_arg(p, report=report)
    p.add_argument("--split", default=DEFAULT_SPLIT, help=about("--split", "by a hash of the "
                   "id; with --limit all, the 127 capitals give ~25 dev and ~50 test facts per "
                   "language"))  # fmt: skip
    p.add_argument("--salt", default=_SPLIT.salt, help=about("--salt", "any text gives another "
                   "split of the same facts (default: none, the empty salt)"))  # fmt: skip


def _steer_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="steer_command", metavar="{build,eval}")
    b = sub.add_parser("build", help="build the task and diff vector stacks from the build split")
    _common(b, report=False)
    _build_args(b)
    cost.add_dry_run_arg(b)
    e = sub.add_parser("eval", help="sweep on dev, report orig/task/diff/both/random on test")
    _common(e, report=True)
    e.add_argument("--vectors", default=None, help=about("--vectors", "required unless "
                   "--transfer-only (default: none)"))  # fmt: skip
    e.add_argument("--dev-per-lang", type=int, default=_SPLIT.dev_per_lang,
                   help=about("--dev-per-lang", "default: all of the dev split"))  # fmt: skip
    e.add_argument("--test-per-lang", type=int, default=_SPLIT.test_per_lang,
                   help=about("--test-per-lang", "default: all of the test split"))  # fmt: skip
    _sweep_args(e)
    cost.add_dry_run_arg(e)
    _test_args(e)
    common.add_metric_args(e)
    add_work_args(e)


def _build_args(b: argparse.ArgumentParser) -> None:
    """``steer build``: how the two vectors are made."""
    b.add_argument("--k-shot", type=int, default=_BUILD.k_shot, help=about("--k-shot"))
    b.add_argument("--per-relation", type=int, default=None, metavar="N",
                   help=about("--per-relation", "default: as many as the smallest relation's "
                   "build split has, so each relation weighs the same"))  # fmt: skip
    b.add_argument("--translation-shots", type=int, default=_BUILD.translation_shots,
                   help=about("--translation-shots", "of the diff vector"))  # fmt: skip
    b.add_argument("--plain-task", action="store_true", help=about("--plain-task", "by default "
                   "the few-shot mean minus the zero-shot mean, which did better on dev "
                   "(docs/methods/repair-vectors.md)"))  # fmt: skip
    b.add_argument("--unit", choices=["resid", "raw"], default=_BUILD.unit, help=about("--unit",
                   "resid: each layer's vector is its direction scaled to the mean last-token "
                   "residual norm there, so alpha is a fraction of that norm; raw: the raw "
                   "mean or difference"))  # fmt: skip


def _sweep_args(e: argparse.ArgumentParser) -> None:
    """``steer eval``: the dev sweep (grid, screening, selection rule) or a fixed setting."""
    e.add_argument("--task-layers", default=None, help=about("--task-layers", "default: every "
                   "second layer from ~20%% to ~90%% of the depth, 4,6,...,16 on the 18-layer "
                   "default model"))  # fmt: skip
    e.add_argument("--task-alphas", default=_flag_text(_GRID.task_alphas),
                   help=about("--task-alphas", "a log grid in the vectors' unit; unit 'resid': "
                   "fractions of the mean residual norm at the layer"))  # fmt: skip
    e.add_argument("--diff-layers", default=None, help=about("--diff-layers", "default: as "
                   "--task-layers"))  # fmt: skip
    e.add_argument("--diff-alphas", default=_flag_text(_GRID.diff_alphas),
                   help=about("--diff-alphas"))  # fmt: skip
    e.add_argument("--top-k", type=int, default=_GRID.top_k, help=about("--top-k", "their best "
                   "pairs are combined"))  # fmt: skip
    e.add_argument("--screen-ids", type=int, default=_GRID.screen_ids, help=about("--screen-ids",
                   "x every language, before the top settings are re-scored on all of dev; "
                   "0 = all of dev"))  # fmt: skip
    e.add_argument("--en-tolerance", type=float, default=_GRID.en_tolerance,
                   help=about("--en-tolerance"))  # fmt: skip
    e.add_argument("--p-threshold", type=float, default=_GRID.p_threshold,
                   help=about("--p-threshold"))  # fmt: skip
    e.add_argument("--config", default=None, help=about("--config", "skips the sweep; labelled "
                   "as not chosen on dev (default: none, the sweep)"))  # fmt: skip


def _test_args(e: argparse.ArgumentParser) -> None:
    """``steer eval``: what is measured on test (controls, repeats, side effects, transfer)."""
    e.add_argument("--control-seeds", dest="seeds", default="0,1,2", metavar="S,S,...",
                   help=about("--control-seeds", "at least 3 advised"))  # fmt: skip
    e.add_argument("--repeats", type=int, default=1, help=about("--repeats", "vectors rebuilt "
                   "each time; the mean and sd over splits are reported"))  # fmt: skip
    e.add_argument("--side-effects", dest="side_effects_on", action="store_true",
                   help=about("--side-effects", "the selected intervention's, in every "
                   "language: accuracy, perplexity on the lines of --parallel DIR and the "
                   "language of continuations (mechlingo.scoring.side_effects)"))  # fmt: skip
    common.add_parallel_arg(e, "that --side-effects measures perplexity on (default: none)",
                            dest="side_effects")  # fmt: skip
    add_side_effects_lines_arg(e)
    e.add_argument("--transfer", nargs="?", const="both", choices=["relation", "lang", "both"],
                   default=None, help=about("--transfer", "vectors built on all relations, all "
                   "but R, or only A, tested on R (needs 2+ relations: add --relation all), and "
                   "built without language L, tested on L; layer and alpha chosen on the build "
                   "relations'/languages' dev split only; gains with bootstrap intervals, "
                   "McNemar p and a norm-matched random control per cell "
                   "(mechlingo.analyses.recall.transfer; default when given: both)"))  # fmt: skip
    m = _MATRIX
    ids = _flag_text((m.build_ids, m.screen_ids, m.dev_ids, m.test_ids))
    e.add_argument("--transfer-ids", default=ids, metavar="B,S,D,T", help=about("--transfer-ids",
                   "build ids per relation, dev screen ids, dev ids (each spread over a row's "
                   "relations), test ids per relation of a column"))  # fmt: skip
    e.add_argument("--transfer-cells", choices=["full", "diagonal"], default=m.cells,
                   help=about("--transfer-cells", "full: every single-relation row on every "
                   "column; diagonal: only R on R"))  # fmt: skip
    e.add_argument("--transfer-only", action="store_true", help=about("--transfer-only",
                   "no --vectors needed"))  # fmt: skip
    common.add_max_new_tokens_arg(e)


@common.command("steer", "build and evaluate the two repair steering vectors", _steer_args)
def cmd_steer(args: argparse.Namespace) -> int:
    which = getattr(args, "steer_command", None)
    if which == "build":
        return _build(args)
    if which == "eval":
        # under torchrun every rank scores its share of each batch list (gathered in order)
        with sharded_scoring():
            return _eval(args)
    raise common.UsageError("use `mechlingo steer build --out VDIR` or `mechlingo steer eval ...`")


def _build(args: argparse.Namespace) -> int:

    if args.k_shot < 1:
        raise common.UsageError("--k-shot must be at least 1")
    facts = common.load_selected_facts(args)
    fractions = _fractions(args.split)
    splits = split_facts(facts, fractions, salt=args.salt)
    if not splits["build"]:
        raise common.UsageError("the build split is empty; raise --limit or the build fraction")
    if args.per_relation is not None and args.per_relation < 1:
        raise common.UsageError("--per-relation must be at least 1")
    build = balance_relations(splits["build"], args.per_relation)
    settings = build_options_from_args(args)
    prompt_sets = steering.steering_prompts(build, k_shot=settings.k_shot,
                                            translation_shots=settings.translation_shots)  # fmt: skip
    if cost.announce(cost.plan_steer_build(prompt_sets, args.model), args):
        return 0
    model = common.load_cli_model(args, facts=facts)
    t0 = time.time()
    with common.usage_errors(ValueError):
        vectors = steering.build_steering_vectors(model, build, settings, progress=not args.quiet)
    vectors.build["ids_per_relation"] = {
        r: len({f.id for f in build if f.relation == r}) for r in vectors.build["relations"]
    }
    vectors.build["split"] = list(fractions)
    vectors.build["salt"] = args.salt
    vectors.build["templates"] = args.templates_used
    summary = {
        "build": vectors.build,
        "norms": vectors.norms(),
        "meta": common.run_meta(model, args, seconds=round(time.time() - t0, 1)),
    }

    # Built beside --out and renamed in one step: never task/ of one run next to another's.
    with atomic_folder(args.out, keep_others=False) as tmp:
        vectors.save(tmp, model)
        write_outputs(tmp, {"summary.json": summary})
    outputs_written()
    print(f"wrote {args.out}/task, {args.out}/diff, build.json and summary.json")
    return 0


def _eval(args: argparse.Namespace) -> int:

    facts = common.load_selected_facts(args)
    if args.repeats < 1:
        raise common.UsageError("--repeats must be at least 1")
    if args.side_effects and args.side_effects_lines < 1:
        raise common.UsageError("--side-effects-lines must be at least 1")
    if args.transfer and common.scorer_from_args(args).metric == "klar":
        raise common.UsageError(
            "--transfer scores with --metric generate or rank; klar's demonstrations are not "
            "yet drawn per transfer row (drop --transfer, or use --metric rank)"
        )
    opts = eval_options_from_args(args)
    if args.transfer_only:
        return _transfer_only(args, facts, opts)
    if not args.vectors:
        raise common.UsageError(
            "steer eval needs --vectors VDIR (a `steer build` folder), or --transfer-only"
        )
    work_folder(args)  # --work is checked before the model loads
    if cost.announce(_eval_plan(args, facts, opts), args):
        return 0
    model = common.load_cli_model(args, facts=facts)
    vectors = _load_vectors(args.vectors, model)
    checkpoints = _eval_checkpoints(args, model, facts)
    t0 = time.time()
    result = steer_eval.run_steer_eval(model, facts, vectors, opts, checkpoints=checkpoints)
    if args.transfer:  # a checkpoint of its own (named by --transfer, which the key skips)
        result.transfer = checkpoints.run(
            f"transfer-{args.transfer}",
            lambda: _transfer(args.transfer, model, facts, opts, vectors.build).summary(),
        )
    if args.side_effects:
        lines = _side_effect_lines(args, result.test_langs())
        result.add_side_effects(model, lines, batch_size=args.batch_size,
                                progress=not args.quiet, checkpoints=checkpoints)  # fmt: skip
    meta = common.run_meta(
        model,
        args,
        vectors=str(args.vectors),
        build=vectors.build,
        seconds=round(time.time() - t0, 1),
    )
    summary = result.summary(meta)
    result.write(
        args.out,
        meta=meta,
        extra={"report.html": repair_report(summary, result.search, result.side_effects)},
    )
    outputs_written()
    finish_checkpoints(checkpoints)
    _print_summary(summary)
    if "transfer" in summary:
        _print_transfer(summary["transfer"])
    print(f"wrote {args.out}/summary.json, generations.jsonl and report.html")
    return 0


def _eval_plan(args: argparse.Namespace, facts: list, opts: SteerEvalOptions) -> cost.CostPlan:
    """The plan and estimate of ``steer eval`` from its flags (no model)."""
    splits = dict(zip(("build", "dev", "test"), opts.split.parts(facts), strict=True))
    return cost.plan_steer_eval(splits, grid=opts.grid, seeds=len(opts.seeds),
                                repeats=opts.repeats, max_new_tokens=args.max_new_tokens,
                                transfer=args.transfer, sweep=not args.config,
                                model=args.model)  # fmt: skip


def _eval_checkpoints(args: argparse.Namespace, model: Model, facts: list) -> Any:
    """The resumable checkpoints of ``steer eval`` (:mod:`mechlingo.cli.work`): keyed by the model,
    the facts, the vectors' files, the side-effect lines and every flag that changes a
    number (the seeds, repeats and --transfer name or add checkpoints instead)."""
    data = data_key(facts=[dataclasses.asdict(f) for f in facts])
    data.update(vectors=hash_files(args.vectors), side_effects=hash_files(args.side_effects))
    skip = ("seeds", "repeats", "transfer", "vectors", "side_effects", "side_effects_on")
    return open_checkpoints(args, model, data, skip=skip)


def _load_vectors(folder: str, model: Model) -> SteeringPair:

    with common.usage_errors(FileNotFoundError, ModelMismatchError, ValueError):
        return SteeringPair.load(folder, model)


def _side_effect_lines(args: argparse.Namespace, langs: list[str]) -> dict[str, list[str]]:
    """The first ``--side-effects-lines`` lines of ``--parallel DIR/<lang>.txt`` for
    every test language."""
    try:
        lines = read_parallel_dir(args.side_effects, langs)
    except ValueError as err:
        raise common.UsageError(f"--parallel: {err}") from err
    return {lg: v[: args.side_effects_lines] for lg, v in lines.items()}


def _transfer_ids(args: argparse.Namespace) -> list[int]:
    ids = parse_ints(args.transfer_ids, "--transfer-ids") or []
    if len(ids) != 4 or min(ids) < 1:
        raise common.UsageError(
            f"--transfer-ids takes four positive numbers B,S,D,T, got {args.transfer_ids}"
        )
    if args.transfer_only and not args.transfer:
        args.transfer = "both"
    return ids


def build_options_from_args(args: argparse.Namespace) -> BuildSettings:
    """``steer build``'s flags as :class:`~mechlingo.analyses.recall.settings.BuildSettings`."""
    return BuildSettings(
        k_shot=args.k_shot,
        translation_shots=args.translation_shots,
        subtract_zero_shot=not args.plain_task,
        unit=args.unit,
        batch_size=args.batch_size,
    )


def eval_options_from_args(args: argparse.Namespace) -> SteerEvalOptions:
    """``steer eval``'s flags as :class:`~mechlingo.analyses.recall.steer_eval.SteerEvalOptions`
    (checked there): the split, the dev search, the scoring, a fixed setting, the seeds and
    repeats, and the transfer matrix's sizes."""
    ids = _transfer_ids(args)
    return SteerEvalOptions(
        split=SplitSettings(_fractions(args.split), args.salt, args.dev_per_lang,
                            args.test_per_lang),
        grid=_dev_grid(args),
        scoring=_scoring(args),
        config=SteeringConfig(*parse_config(args.config)) if args.config else None,
        seeds=tuple(parse_ints(args.seeds, "--control-seeds", allow_empty=True) or []),
        repeats=args.repeats,
        matrix=MatrixSettings(cells=args.transfer_cells, build_ids=ids[0], screen_ids=ids[1],
                              dev_ids=ids[2], test_ids=ids[3], en_tolerance=args.en_tolerance,
                              p_threshold=args.p_threshold),
    )  # fmt: skip


def _dev_grid(args: argparse.Namespace) -> DevGrid:
    """``steer eval``'s dev-search flags as :class:`~mechlingo.analyses.recall.settings.DevGrid`."""
    task_layers = parse_ints(args.task_layers, "--task-layers")
    diff_layers = parse_ints(args.diff_layers, "--diff-layers")
    return DevGrid(
        task_layers=None if task_layers is None else tuple(task_layers),
        diff_layers=None if diff_layers is None else tuple(diff_layers),
        task_alphas=tuple(parse_floats(args.task_alphas, "--task-alphas") or []),
        diff_alphas=tuple(parse_floats(args.diff_alphas, "--diff-alphas") or []),
        top_k=args.top_k,
        screen_ids=args.screen_ids,
        en_tolerance=args.en_tolerance,
        p_threshold=args.p_threshold,
    )


def _scoring(args: argparse.Namespace) -> ScoringOptions:
    """The scoring flags as :class:`~mechlingo.analyses.recall.settings.ScoringOptions`."""
    return ScoringOptions(
        metric=common.scorer_from_args(args),
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        progress=not args.quiet,
    )


def _transfer(
    by: str, model: Model, facts: list, opts: SteerEvalOptions, built: dict | None
) -> transfer.TransferMatrices:
    """:func:`mechlingo.analyses.recall.transfer.transfer_matrices` by ``by`` with the
    options' matrix sizes, split and scoring."""
    split = SplitSettings(opts.split.fractions, opts.split.salt)
    return transfer.transfer_matrices(model, facts, by=by, matrix=opts.matrix, built=built,
                                      split=split, scoring=opts.scoring)  # fmt: skip


def _transfer_only(args: argparse.Namespace, facts: list, opts: SteerEvalOptions) -> int:
    """``steer eval --transfer-only``: the transfer matrices alone (one checkpoint)."""
    work_folder(args)
    model = common.load_cli_model(args, facts=facts)
    data = data_key(facts=[dataclasses.asdict(f) for f in facts])
    checkpoints = open_checkpoints(args, model, data, skip=("seeds", "repeats", "transfer", "vectors",
                                                  "side_effects"))  # fmt: skip
    t0 = time.time()
    matrices = checkpoints.run(
        f"transfer-{args.transfer}",
        lambda: _transfer(args.transfer, model, facts, opts, None).summary(),
    )
    summary: dict[str, Any] = {"transfer": matrices}
    summary["meta"] = common.run_meta(model, args, seconds=round(time.time() - t0, 1))
    write_outputs(args.out, {"summary.json": summary,
                             "report.html": transfer_report(summary)})  # fmt: skip
    outputs_written()
    finish_checkpoints(checkpoints)
    _print_transfer(summary["transfer"])
    print(f"wrote {args.out}/summary.json and report.html")
    return 0


def _print_transfer(transfer: dict) -> None:
    for by in ("relation", "lang"):
        if by in transfer:
            for kind, t in transfer[by]["summary"].items():
                g = t["mean_gain"]
                print(f"transfer by {by}, {kind}: {t['cells']} cells, mean gain "
                      f"{_pct(g)} points; CI above 0 in {t['ci_above_0']}, below 0 in "
                      f"{t['ci_below_0']}")  # fmt: skip
    for note in transfer.get("notes", []):
        print(f"transfer: {note}")


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}"


def _print_summary(summary: dict) -> None:
    for cond, acc in summary["accuracy"].items():
        print(f"{cond:>10}: " + " ".join(f"{lg}={x:.2f}" for lg, x in acc.items()))
    sel = summary["selected"]
    g = summary["non_english_gain"].get(sel, {})
    print(
        f"dev effect: {summary['dev_effect']} (selected {sel}); non-English gain of {sel}: "
        f"{_pct(g.get('estimate'))} points [{_pct(g.get('lo'))}, {_pct(g.get('hi'))}], McNemar p "
        f"= {summary['mcnemar_vs_orig'].get(sel, {}).get('p', float('nan')):.3g}"
    )
    head = summary.get("headline", {})
    both, single = head.get("both_condition", "both"), head.get("best_single", "task")
    for name, label in (("headroom_rule", "headroom rule"), ("literal_rule", "literal rule")):
        h = head.get(name, {})
        if h.get("language") is None:
            continue
        parts = []
        for cond, g in ((both, h.get("both")), (single, h.get("best_single"))):
            g = g or {}
            r = g.get("relative")
            rel = "n/a (orig 0)" if r is None else f"{r['estimate']:+.2f}"
            parts.append(f"{cond} {_pct(g.get('estimate'))} [{_pct(g.get('lo'))}, "
                         f"{_pct(g.get('hi'))}] points, relative {rel}")  # fmt: skip
        print(f"lowest language, {label} (fixed on dev): {h['language']}: " + "; ".join(parts))
    if summary.get("lowest_language_excluded"):
        print("excluded for lack of headroom: " + ",".join(summary["lowest_language_excluded"]))
    if head.get("note"):
        print(head["note"])
    for why, n in summary.get("skipped", {}).items():
        print(f"skipped {n} test record(s) under --metric {summary['metric']['metric']}: {why}")
    for w in summary.get("warnings", []):
        print(f"warning: {w}")

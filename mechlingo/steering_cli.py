"""``mechlingo steer build`` and ``mechlingo steer eval``: the two repair vectors on the CLI.

``steer build --out VDIR`` builds the recall-engagement (task) and back-translation (diff)
vector stacks from the *build* split of the selected facts and saves them.

``steer eval --vectors VDIR --langs ... --out DIR`` chooses layer and scale of each vector on
the *dev* split (a small grid on a few languages), reports test accuracy per language for
``orig``, ``task``, ``diff``, ``both`` and ``random``, and writes ``DIR/summary.json``
(``accuracy``, ``lowest_language``, ``relative_gain_lowest``, ...) and ``DIR/report.html``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from mechlingo.cli import (
    UsageError,
    add_data_args,
    add_model_args,
    command,
    load_cli_model,
    load_selected_facts,
    run_meta,
    split_list,
)

ALL_LANGS = "en,de,fr,es,it,pt,ru,zh,ja,ko,ar,hi"


def _floats(text: str | None, flag: str) -> list[float] | None:
    items = split_list(text)
    if items is None:
        return None
    try:
        return [float(x) for x in items]
    except ValueError as err:
        raise UsageError(f"{flag} takes comma-separated numbers, got {text!r}") from err


def _ints(text: str | None, flag: str) -> list[int] | None:
    items = split_list(text)
    if items is None:
        return None
    try:
        return [int(x) for x in items]
    except ValueError as err:
        raise UsageError(f"{flag} takes comma-separated integers, got {text!r}") from err


def _depth_layers(model: Any, fractions: tuple[float, ...]) -> list[int]:
    """Layers at the given fractions of the model's depth (distinct, in range)."""
    n = int(model.cfg.n_layers)
    return sorted({min(n - 1, max(0, round(n * f))) for f in fractions})


def _fractions(text: str) -> tuple[float, float, float]:
    vals = _floats(text, "--split") or []
    if len(vals) != 3 or abs(sum(vals) - 1) > 1e-6 or min(vals) < 0:
        raise UsageError(f"--split takes three fractions summing to 1 (build,dev,test), got {text}")
    return vals[0], vals[1], vals[2]


def _common(p: argparse.ArgumentParser, default_langs: str) -> None:
    add_model_args(p)
    add_data_args(p, default_langs=default_langs)
    p.add_argument("--out", required=True, help="output folder (created; files in it replaced)")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per forward pass")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--split",
        default="0.3,0.2,0.5",
        help="build,dev,test fractions of fact ids (split by a hash of the id; default "
        "0.3,0.2,0.5)",
    )


def _steer_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="steer_command", metavar="{build,eval}")
    b = sub.add_parser("build", help="build the task and diff vector stacks from the build split")
    _common(b, ALL_LANGS)
    b.add_argument("--k-shot", type=int, default=3, help="demonstrations per few-shot prompt")
    b.add_argument(
        "--plain-task",
        action="store_true",
        help="task vector = plain few-shot mean (default: few-shot mean minus zero-shot mean, "
        "which did better on dev; see docs/methods/repair-vectors.md)",
    )
    b.add_argument(
        "--unit",
        choices=["resid", "raw"],
        default="resid",
        help="resid (default): each layer's vector is its direction scaled to the mean "
        "last-token residual norm there, so alpha is a fraction of that norm; raw: the raw "
        "mean/difference",
    )
    e = sub.add_parser("eval", help="sweep on dev, report orig/task/diff/both/random on test")
    _common(e, ALL_LANGS)
    e.add_argument("--vectors", required=True, help="folder written by `steer build`")
    e.add_argument(
        "--sweep-langs",
        default="en,fr,ja,hi",
        help="languages of the dev sweep (default en,fr,ja,hi; a few keep it cheap)",
    )
    e.add_argument("--dev-per-lang", type=int, default=10, help="dev fact ids per relation")
    e.add_argument("--test-per-lang", type=int, default=None, help="test fact ids per relation")
    e.add_argument(
        "--task-layers",
        default=None,
        help="layers tried for the task vector (default: 22%%, 33%%, 44%% of the depth; "
        "4,6,8 on the 18-layer default model)",
    )
    e.add_argument(
        "--task-alphas",
        default="0.03,0.1,0.3",
        help="scales tried for the task vector, in the vectors' unit (default unit 'resid': "
        "fractions of the mean residual norm at the layer)",
    )
    e.add_argument(
        "--diff-layers",
        default=None,
        help="layers tried for the diff vector (default: 56%%, 67%%, 78%% of the depth; "
        "10,12,14 on the 18-layer default model)",
    )
    e.add_argument(
        "--diff-alphas",
        default="0.03,0.1,0.3",
        help="scales tried for the diff vector, in the vectors' unit (see --task-alphas)",
    )
    e.add_argument("--top-k", type=int, default=2, help="best singles combined into `both`")
    e.add_argument(
        "--config",
        default=None,
        help="skip the sweep: task_layer,task_alpha,diff_layer,diff_alpha",
    )
    e.add_argument(
        "--transfer",
        action="store_true",
        help="also measure transfer: vectors rebuilt without the lowest language (tested on "
        "it) and, with several relations, built on the first relation and tested on the others",
    )
    e.add_argument("--max-new-tokens", type=int, default=6, help="greedy tokens (default 6)")


@command("steer", "build and evaluate the two repair steering vectors", _steer_args)
def cmd_steer(args: Any) -> int:
    which = getattr(args, "steer_command", None)
    if which == "build":
        return _build(args)
    if which == "eval":
        return _eval(args)
    raise UsageError("use `mechlingo steer build --out VDIR` or `mechlingo steer eval ...`")


def _build(args: Any) -> int:
    from mechlingo.report import write_outputs
    from mechlingo.steering import build_repair_vectors, split_facts

    if args.k_shot < 1:
        raise UsageError("--k-shot must be at least 1")
    facts = load_selected_facts(args)
    splits = split_facts(facts, _fractions(args.split))
    if not splits["build"]:
        raise UsageError("the build split is empty; raise --limit or the build fraction")
    model = load_cli_model(args)
    t0 = time.time()
    try:
        vectors = build_repair_vectors(
            model,
            splits["build"],
            k_shot=args.k_shot,
            subtract_zero_shot=not args.plain_task,
            unit=args.unit,
            batch_size=args.batch_size,
            progress=not args.quiet,
        )
    except ValueError as err:
        raise UsageError(str(err)) from err
    vectors.build["split"] = list(_fractions(args.split))
    summary = {
        "build": vectors.build,
        "norms": vectors.norms(),
        "meta": run_meta(model, args, seconds=round(time.time() - t0, 1)),
    }
    from mechlingo.artifacts import atomic_folder

    # Built beside --out and renamed in one step: never task/ of one run next to another's.
    with atomic_folder(args.out, keep_others=False) as tmp:
        vectors.save(tmp, model)
        write_outputs(tmp, {"summary.json": summary})
    print(f"wrote {args.out}/task, {args.out}/diff, build.json and summary.json")
    return 0


def _eval(args: Any) -> int:
    from mechlingo.interventions import ModelMismatchError
    from mechlingo.plots import accuracy_bars
    from mechlingo.report import Report, write_outputs
    from mechlingo.steering import (
        RepairVectors,
        SteeringConfig,
        evaluate_conditions,
        split_facts,
        sweep,
        take_per_lang,
        transfer,
    )

    facts = load_selected_facts(args)
    splits = split_facts(facts, _fractions(args.split))
    test = take_per_lang(splits["test"], args.test_per_lang)
    if not test:
        raise UsageError("the test split is empty; raise --limit")
    model = load_cli_model(args)
    try:
        vectors = RepairVectors.load(args.vectors, model)
    except (FileNotFoundError, ModelMismatchError, ValueError) as err:
        raise UsageError(str(err)) from err
    t0 = time.time()
    progress = not args.quiet
    sweep_result = None
    if args.config:
        vals = split_list(args.config) or []
        if len(vals) != 4:
            raise UsageError("--config takes task_layer,task_alpha,diff_layer,diff_alpha")
        config = SteeringConfig(int(vals[0]), float(vals[1]), int(vals[2]), float(vals[3]))
    else:
        sweep_langs = set(split_list(args.sweep_langs) or [])
        dev = [f for f in splits["dev"] if f.lang in sweep_langs]
        dev = take_per_lang(dev, args.dev_per_lang)
        if not dev:
            raise UsageError("no dev facts in --sweep-langs; check --sweep-langs and --limit")
        sweep_result = sweep(
            model,
            vectors,
            dev,
            task_layers=_ints(args.task_layers, "--task-layers")
            or _depth_layers(model, (0.22, 0.33, 0.44)),
            task_alphas=_floats(args.task_alphas, "--task-alphas") or [],
            diff_layers=_ints(args.diff_layers, "--diff-layers")
            or _depth_layers(model, (0.56, 0.67, 0.78)),
            diff_alphas=_floats(args.diff_alphas, "--diff-alphas") or [],
            top_k=args.top_k,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            progress=progress,
        )
        config = sweep_result.best
    res = evaluate_conditions(
        model,
        vectors,
        config,
        test,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        progress=progress,
    )
    summary = res.summary()
    summary["n_test_facts"] = {
        lg: sum(1 for f in test if f.lang == lg) for lg in sorted({f.lang for f in test})
    }
    if sweep_result is not None:
        summary["sweep"] = {
            "dev_baseline": sweep_result.baseline,
            "rows": sweep_result.rows,
            "n_dev_facts": len(dev),
        }
    if args.transfer:
        rels = sorted({f.relation for f in facts})
        same_build = {
            "subtract_zero_shot": bool(vectors.build.get("subtract_zero_shot", False)),
            "unit": vectors.unit,
            "k_shot": int(vectors.build.get("k_shot", 3)),
            "max_new_tokens": args.max_new_tokens,
            "batch_size": args.batch_size,
        }
        summary["transfer"] = {}
        if res.lowest_language is not None:
            summary["transfer"]["without_lowest_language"] = transfer(
                model,
                splits["build"],
                test,
                config,
                holdout_lang=res.lowest_language,
                **same_build,
            )
        if len(rels) > 1:
            summary["transfer"]["across_relations"] = transfer(
                model,
                splits["build"],
                test,
                config,
                build_relations=rels[:1],
                test_relations=rels[1:],
                **same_build,
            )
    summary["meta"] = run_meta(
        model,
        args,
        vectors=str(args.vectors),
        build=vectors.build,
        seconds=round(time.time() - t0, 1),
    )
    report = _report(summary, res, sweep_result, accuracy_bars, Report)
    records = [{"condition": c, **r} for c, er in res.results.items() for r in er.records]
    write_outputs(
        args.out,
        {
            "summary.json": summary,
            "generations.jsonl": "\n".join(json.dumps(r, ensure_ascii=False) for r in records)
            + "\n",
            "report.html": report,
        },
    )
    for cond, acc in summary["accuracy"].items():
        print(f"{cond:>6}: " + " ".join(f"{lg}={x:.2f}" for lg, x in acc.items()))
    gain = summary["relative_gain_lowest"]
    print(
        f"lowest language with orig > 0: {summary['lowest_language']}; relative gain of both "
        + ("n/a" if gain is None else f"{gain:+.2f}")
        + "; mean absolute gain: "
        + " ".join(f"{c}={g:+.3f}" for c, g in summary["mean_absolute_gain"].items())
    )
    print(f"wrote {args.out}/summary.json, generations.jsonl and report.html")
    return 0


def _report(summary: dict, res: Any, sweep_result: Any, accuracy_bars: Any, Report: Any) -> Any:
    report = Report("mechlingo: repair steering vectors", summary["meta"])
    cfg = summary["config"]
    build = summary["meta"].get("build", {})
    task_text = (
        "few-shot mean minus zero-shot mean"
        if build.get("subtract_zero_shot")
        else "a plain mean over few-shot recall prompts"
    )
    report.add_text(
        "Two steering vectors are added to the residual stream (resid_pre) at each prompt's "
        f"last token: the recall-engagement (task) vector ({task_text}) and the "
        "back-translation (diff) vector, translation-prompt mean minus zero-shot mean. "
        "Layers and scales were chosen on dev facts; accuracy is greedy generation on test "
        "facts (ids never used for building or choosing). 'random' adds random vectors of the "
        f"same norms at the same places. Chosen: task at layer {cfg['task_layer']} x "
        f"{cfg['task_alpha']:g}, diff at layer {cfg['diff_layer']} x {cfg['diff_alpha']:g}; "
        f"alpha unit: {summary.get('alpha_unit_text') or summary.get('alpha_unit')}.",
        note=True,
    )
    report.add_heading("Test accuracy per language")
    report.add_figure(res.fig_accuracy())
    report.add_table(
        [
            {"condition": c, **{lg: round(x, 3) for lg, x in acc.items()}}
            for c, acc in summary["accuracy"].items()
        ]
    )
    low = summary["lowest_language"]
    zero = ", ".join(summary.get("zero_orig_languages", [])) or "none"
    report.add_text(
        f"Lowest language (lowest orig accuracy among languages with orig > 0): {low}. "
        "Relative gain there: "
        + ", ".join(
            f"{c} " + ("n/a" if g is None else f"{g:+.2f}")
            for c, g in summary["relative_gain_lowest_by_condition"].items()
        )
        + f". Languages at 0 without intervention: {zero}."
    )
    report.add_heading("Absolute gain over orig")
    report.add_table(
        [
            {
                "condition": c,
                "mean": round(summary["mean_absolute_gain"][c], 3),
                **{lg: round(x, 3) for lg, x in g.items()},
            }
            for c, g in summary["absolute_gain"].items()
        ]
    )
    report.add_heading("Answered in English instead of the prompt's language")
    report.add_figure(accuracy_bars(summary["answered_in_english"], "English-answer rate"))
    if sweep_result is not None:
        report.add_heading("Dev sweep")
        report.add_figure(sweep_result.fig_heatmap("task"))
        report.add_figure(sweep_result.fig_heatmap("diff"))
        report.add_table(
            [
                {k: v for k, v in r.items() if k != "per_lang"}
                for r in sweep_result.rows
                if r["vector"] == "both"
            ]
        )
    if "transfer" in summary:
        report.add_heading("Transfer")
        report.add_table(
            [
                {
                    "setting": name,
                    "built on": json.dumps(t["built_on"]),
                    "tested on": json.dumps(t["tested_on"]),
                    "orig": round(t["mean"]["orig"], 3),
                    "both": round(t["mean"]["both"], 3),
                }
                for name, t in summary["transfer"].items()
            ]
        )
    return report

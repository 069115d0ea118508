"""``mechlingo experts`` and ``mechlingo align`` (expert neurons, cross-lingual alignment).

``mechlingo experts --target es --k 50,100,500 --parallel DIR --out EDIR`` finds the expert
neurons of ``es``, saves their clamps and random-neuron controls (``EDIR/es-k100``,
``EDIR/es-k100-random``, ...), the k curve and the k the papers' rule chooses (``chosen_k``);
``mechlingo align --clamp EDIR --parallel DIR --out DIR`` measures retrieval and cosine
distances before and after that clamp and its control. Entry points: :func:`cmd_experts`,
:func:`cmd_align`, :func:`options_from_args` and :func:`load_parallel`; the runs are
:func:`mechlingo.analyses.experts.run.run_experts` and
:func:`mechlingo.analyses.experts.align_run.run_alignment`, resumable
(:mod:`mechlingo.cli.work`). ``docs/methods/expert-neurons.md`` has the method, the k rule,
the files written and measured runs.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mechlingo.activations.shards import memory_budget, shared_directory
from mechlingo.analyses.experts import ExpertError
from mechlingo.analyses.experts.align import AlignmentError, drop_empty_lines
from mechlingo.analyses.experts.align_run import AlignOptions, load_clamp_pair, run_alignment
from mechlingo.analyses.experts.run import KCURVE_MAX_TOKENS, ExpertSettings, run_experts
from mechlingo.cli import common, cost, work
from mechlingo.cli.flags import parse_ints
from mechlingo.cli.glossary import about
from mechlingo.cli.streams import outputs_written
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.errors import ArtifactError, InputError, InterventionError
from mechlingo.core.types import Model
from mechlingo.core.untrusted import read_json
from mechlingo.data import LANGS, parallel_sentences, read_parallel
from mechlingo.report.experts import align_report, experts_report, interval_rows

#: the settings whose defaults the flags of ``experts`` show
_DEFAULTS = ExpertSettings()
#: the fields of :class:`ExpertSettings` that flags of the same name set as they are
_SETTINGS_FLAGS = ("pool", "score", "value", "seed", "samples", "max_tokens",
                   "ppl_budget", "ppl_others", "batch_size")  # fmt: skip


#: ``--lines``: parallel lines per language when not given (experts, align, tuned-lens)
DEFAULT_LINES = 300
#: ``--max-tokens``: tokens kept of each text when not given (the k curve's own bound)
DEFAULT_MAX_TOKENS = KCURVE_MAX_TOKENS
#: ``--heldout``: held-out lines per language when not given
DEFAULT_HELDOUT = 16


def add_line_args(g: Any) -> None:
    """``--langs``, ``--lines``, ``--offset``, ``--max-tokens``: the same in every command
    that reads parallel text."""
    common.add_langs_arg(g)
    g.add_argument("--lines", type=int, default=DEFAULT_LINES, metavar="N",
                   help=about("--lines", "their pooled statistics take ~0.5 GB in 12 "
                   "languages on the embedded model (experts); align retrieves among them"))  # fmt: skip
    g.add_argument("--offset", type=int, default=0, metavar="N", help=about("--offset", "keep "
                   "expert-finding, evaluation and training lines apart"))  # fmt: skip
    g.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N",
                   help=about("--max-tokens", "every bundled sentence fits (at most 33 "
                   "tokens of the embedded model) and 93%% of the NTREX lines; it bounds a "
                   "text's cost"))  # fmt: skip


def add_heldout_arg(g: Any) -> None:
    """``--heldout`` (experts' k curve, the tuned lens's held-out KL)."""
    g.add_argument("--heldout", type=int, default=DEFAULT_HELDOUT, metavar="N",
                   help=about("--heldout", "never fitted on: experts measure the k curve's "
                   "perplexity on them, tuned-lens the held-out KL per layer"))  # fmt: skip


def _data_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    common.add_parallel_arg(g, "or a FLORES+ (<split>/<lang_Script>.parquet) or FLORES-200 "
                            "(<split>/<lang_Script>.<split>) folder; default: the bundled "
                            "parallel sentences")  # fmt: skip
    g.add_argument("--flores-split", choices=("dev", "devtest"), default="devtest",
                   help=about("--flores-split"))  # fmt: skip
    add_line_args(g)


def load_parallel(
    args: argparse.Namespace, *, offset: int | None = None, limit: int | None = None
) -> dict:
    """The parallel sentences selected by ``--parallel/--langs/--offset/--lines`` (lines that
    are empty in some language are dropped in all)."""

    targets = common.split_list(getattr(args, "target", None)) or []
    langs = common.parallel_langs(args, targets)
    offset = args.offset if offset is None else offset
    limit = args.lines if limit is None else limit
    if limit is not None and limit < 1:
        raise common.UsageError("--lines must be at least 1")
    if offset < 0:
        raise common.UsageError("--offset must be >= 0")
    with common.usage_errors(ValueError):
        if args.parallel:
            texts = read_parallel(args.parallel, langs, getattr(args, "flores_split", "devtest"))
        else:
            texts = parallel_sentences(langs or list(LANGS))  # parallel_langs: never None
    texts = drop_empty_lines(texts)
    out = {lg: s[offset : offset + limit if limit else None] for lg, s in texts.items()}
    short = [lg for lg, s in out.items() if not s]
    if short:
        raise common.UsageError(
            f"no sentences left for {short} after --offset {offset} (the data has "
            f"{len(next(iter(texts.values())))} lines)"
        )
    return out


# --------------------------------------------------------------------------------------


def _experts_args(p: argparse.ArgumentParser) -> None:
    common.add_model_args(p)
    _data_args(p)
    common.add_out_arg(p)
    g = p.add_argument_group("experts")
    g.add_argument("--target", required=True, help=about("--target", "comma-separated; the "
                   "targets are read besides --langs"))  # fmt: skip
    g.add_argument("--k", default="50,100,200,500,1000,2000", help=about("--k"))
    g.add_argument("--pool", choices=("mean", "max"), default=_DEFAULTS.pool,
                   help=about("--pool"))  # fmt: skip
    g.add_argument("--score", choices=("auroc", "ap", "lape"), default=_DEFAULTS.score,
                   help=about("--score", "AUROC or average precision of the pooled activation "
                   "against the other languages, or LAPE (activation-probability entropy)"))  # fmt: skip
    g.add_argument("--value", choices=("mean", "median"), default=_DEFAULTS.value,
                   help=about("--value"))  # fmt: skip
    g.add_argument("--layers", default=None, help=about("--layers", "default: all layers"))
    g.add_argument("--seed", type=int, default=_DEFAULTS.seed, help=about("--seed"))
    g.add_argument("--no-curve", action="store_true", help=about("--no-curve"))
    g.add_argument("--samples", type=int, default=_DEFAULTS.samples, help=about("--samples"))
    g.add_argument("--sample-tokens", type=int, default=_DEFAULTS.max_new_tokens,
                   help=about("--sample-tokens", "a sample is free text whose language is "
                   "identified, not a short answer"))  # fmt: skip
    _k_rule_args(g)
    _shard_args(g)
    work.add_work_args(p)
    cost.add_dry_run_arg(p)


def _k_rule_args(g: Any) -> None:
    """``--heldout``, ``--ppl-budget``, ``--ppl-others``: the k curve's lines and the k rule."""
    add_heldout_arg(g)
    g.add_argument("--ppl-budget", type=float, default=_DEFAULTS.ppl_budget,
                   help=about("--ppl-budget", "the times a clamp may raise the target "
                   "language's held-out perplexity"))  # fmt: skip
    g.add_argument("--ppl-others", choices=("geomean", "max", "none"),
                   default=_DEFAULTS.ppl_others, help=about("--ppl-others", "none = the "
                   "papers' rule, the target rate against the target's perplexity; geomean, "
                   "max = stricter rules on their geometric mean or each of them "
                   "(summary.json has the geomean rule's k beside as k_choice_stricter)"))  # fmt: skip


def _shard_args(g: Any) -> None:
    """``--max-memory``, ``--shard-dir``: the out-of-core statistics."""
    g.add_argument(
        "--max-memory",
        default=None,
        metavar="SIZE",
        help=about(
            "--max-memory",
            "e.g. 8G (default: a quarter of the memory available, "
            "shared by the ranks of this machine); when the pooled activations would "
            "take more than half of it they stream to disk shards and are scored a "
            "block of neurons at a time, with the same numbers (docs/scaling.md)",
        ),
    )
    g.add_argument(
        "--shard-dir",
        default=None,
        metavar="DIR",
        help=about(
            "--shard-dir",
            "an empty folder (default: a temporary folder, removed "
            "afterwards, only when --max-memory calls for it); under torchrun every "
            "rank must see it",
        ),
    )


@common.command(
    "experts", "expert (language-specific) neurons, clamps and the k curve", _experts_args
)
def cmd_experts(args: argparse.Namespace) -> int:
    """``mechlingo experts``, with the out-of-core shard folder (if one is used) kept for the
    whole command and removed afterwards."""
    with _shard_folder(args):
        return _cmd_experts(args)


@contextlib.contextmanager
def _shard_folder(args: argparse.Namespace) -> Iterator[None]:
    """Sets ``args.max_memory_bytes`` (the ``--max-memory`` cap) and ``args.shard_store``:
    ``--shard-dir``, or a temporary folder shared by the ranks (removed at the end), where
    :func:`~mechlingo.analyses.experts.run.run_experts` streams the statistics when they
    call for it."""
    try:
        args.max_memory_bytes = memory_budget(args.max_memory)
    except InputError as err:
        raise common.UsageError(str(err), where="--max-memory", fix="e.g. --max-memory 8G") from err
    if args.shard_dir:
        args.shard_store = Path(args.shard_dir)
        yield
        return
    with shared_directory() as tmp:
        args.shard_store = tmp / "pooled"
        yield


def _cmd_experts(args: argparse.Namespace) -> int:

    targets, ks = _experts_flags(args)
    texts = load_parallel(args)
    missing = [t for t in targets if t not in texts]
    if missing:
        raise common.UsageError(f"no data for target language(s) {missing}; have {list(texts)}")
    if len(texts) < 2:
        raise common.UsageError("experts need at least two languages (the target and others)")
    heldout = None if args.no_curve else _heldout(args)  # checked before the expensive part
    work.work_folder(args)  # --work is checked before the model loads
    n_held = None if heldout is None else len(next(iter(heldout.values()), []))
    plan = cost.plan_experts(texts, targets, ks, heldout=n_held, samples=args.samples,
                             max_new_tokens=args.sample_tokens, model=args.model)  # fmt: skip
    if cost.announce(plan, args):
        return 0
    model = common.load_cli_model(args, texts=texts)
    checkpoints = _experts_checkpoints(args, model, texts, heldout)
    t0 = time.time()
    with common.usage_errors(ExpertError):
        run = run_experts(
            model, texts, targets, ks, heldout=heldout, settings=options_from_args(args),
            checkpoints=checkpoints, shard_dir=args.shard_store, shard_always=bool(args.shard_dir),
            max_memory=args.max_memory_bytes,
        )  # fmt: skip
    meta = common.run_meta(
        model,
        args,
        langs=list(texts),
        sentences_per_lang=len(next(iter(texts.values()))),
        seconds=round(time.time() - t0, 1),
    )
    summary = run.summary(meta)
    report = experts_report(
        run.experts, summary, run.curves, summary["k_choice"], k_show=run.k_show, score=args.score
    )
    run.write(args.out, meta=meta, extra={"report.html": report})
    outputs_written()
    work.finish_checkpoints(checkpoints)
    for t, ch in summary["k_choice"].items():
        print(f"{t}: the k rule chose k = {ch['k']} ({ch['rule']})")
    print(f"wrote {args.out}: summary.json, experts.csv, report.html, clamps {sorted(run.clamps)}")
    return 0


def _experts_flags(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    """The targets and the sorted distinct ``--k`` values, after the checks of the k rule's
    flags."""
    targets = common.split_list(args.target) or []
    ks = sorted(set(parse_ints(args.k, "--k", positive=True) or []))
    if not ks:
        raise common.UsageError(f"--k needs positive integers, got {args.k!r}")
    if not args.ppl_budget > 0 or args.ppl_budget == float("inf"):
        raise common.UsageError(f"--ppl-budget must be a positive number, got {args.ppl_budget}")
    if args.samples < 1:
        raise common.UsageError(f"--samples must be at least 1, got {args.samples}")
    return targets, ks


def options_from_args(args: argparse.Namespace) -> ExpertSettings:
    """``experts``' flags as :class:`~mechlingo.analyses.experts.run.ExpertSettings`."""
    layers = parse_ints(args.layers, "--layers")
    same = {name: getattr(args, name) for name in _SETTINGS_FLAGS}
    return ExpertSettings(
        **same,
        max_new_tokens=args.sample_tokens,
        layers=None if layers is None else tuple(layers),
        progress=not args.quiet,
    )


def _heldout(args: argparse.Namespace) -> dict:
    """The ``--heldout`` sentences after the first ``--lines`` (the k curve's perplexity)."""
    try:
        return load_parallel(args, offset=args.offset + args.lines, limit=args.heldout)
    except common.UsageError as err:
        raise common.UsageError(
            f"no held-out sentences for the k curve after the first {args.lines}: {err}; "
            "lower --lines or pass --no-curve"
        ) from err


def _experts_checkpoints(
    args: argparse.Namespace, model: Model, texts: dict, heldout: dict | None
) -> Checkpoints:
    """The resumable checkpoints of ``experts`` (:mod:`mechlingo.cli.work`): keyed by the model,
    the sentences, the held-out lines and every flag that changes a number (the targets and
    the k are in the checkpoint names; the k rule's flags change no stored number)."""
    skip = ("target", "k", "no_curve", "ppl_budget", "ppl_others", "max_memory",
            "max_memory_bytes", "shard_dir")  # fmt: skip
    return work.open_checkpoints(
        args, model, work.data_key(texts=texts, heldout=heldout), skip=skip
    )


# --------------------------------------------------------------------------------------


def _resolve_clamp(path: str, target: str | None) -> str:
    """A clamp folder as given, or, for an ``experts`` output folder, the clamp of the k its
    rule chose for ``target`` (or its only target)."""

    p = Path(path)
    if (p / "intervention.json").is_file() or not (p / "summary.json").is_file():
        return path  # a clamp folder (or missing: load_intervention says so)
    doc = read_json(p / "summary.json", ArtifactError, root=p, fix="pass a clamp folder")
    chosen = (doc.get("chosen_k") if isinstance(doc, dict) else None) or {}
    if not isinstance(chosen, dict) or not all(
        k is None or (isinstance(k, int) and not isinstance(k, bool) and 1 <= k < 2**31)
        for k in chosen.values()
    ):
        raise ArtifactError(
            f"{p / 'summary.json'}: chosen_k is not a map of languages to positive counts",
            where="--clamp",
            fix="pass a clamp folder such as EDIR/es-k500, or run `experts` again",
        )
    if target is None and len(chosen) == 1:
        target = next(iter(chosen))
    if target not in chosen:
        raise common.UsageError(
            f"{path} is an experts folder with chosen k for {sorted(chosen) or 'no language'}",
            where="--clamp",
            fix="pass --target LANG, or a clamp folder such as EDIR/es-k500",
        )
    k = chosen[target]
    if k is None:
        raise common.UsageError(
            f"the k rule of {path} chose no k for {target} (none within the perplexity budget)",
            where="--clamp",
            fix="pass a clamp folder such as EDIR/es-k100 explicitly (and say it was not chosen)",
        )
    return str(p / f"{target}-k{k}")


def _align_args(p: argparse.ArgumentParser) -> None:
    common.add_model_args(p)
    _data_args(p)
    common.add_out_arg(p)
    g = p.add_argument_group("alignment")
    g.add_argument("--clamp", default=None, help=about("--clamp", "e.g. EDIR/es-k500; an "
                   "`experts` output folder gives the clamp of the k its rule chose "
                   "(`chosen_k` in EDIR/summary.json); default: none, no clamp"))  # fmt: skip
    g.add_argument("--control", default=None, help=about("--control", "default: CLAMP-random "
                   "when it exists"))  # fmt: skip
    g.add_argument("--layer", type=int, default=None, help=about("--layer", "default: the "
                   "last"))  # fmt: skip
    g.add_argument("--centre", action="store_true", help=about("--centre"))
    g.add_argument("--target", default=None, help=about("--target", "default: from the "
                   "clamp"))  # fmt: skip
    g.add_argument("--side-effects", action="store_true", help=about("--side-effects", "the "
                   "clamp's, in every language (mechlingo.scoring.side_effects): accuracy on "
                   "--side-effects-lines bundled capitals per language (natural templates), "
                   "perplexity and output language on the last --side-effects-lines lines of "
                   "each language"))  # fmt: skip
    add_side_effects_lines_arg(g)
    work.add_work_args(p)
    cost.add_dry_run_arg(p)


def add_side_effects_lines_arg(g: Any) -> None:
    """``--side-effects-lines`` (align, steer eval)."""
    g.add_argument("--side-effects-lines", type=int, default=20, metavar="N",
                   help=about("--side-effects-lines"))  # fmt: skip


@common.command("align", "cross-lingual retrieval and distances before/after a clamp", _align_args)
def cmd_align(args: argparse.Namespace) -> int:

    texts = load_parallel(args)
    if len(texts) < 2:
        raise common.UsageError("alignment needs at least two languages")
    if args.target is not None and args.target not in texts:
        raise common.UsageError(
            f"--target {args.target} has no sentences; the languages are {list(texts)}",
            where="--target",
            fix="pick one of them or drop --target",
        )
    clamp_path = _resolve_clamp(args.clamp, args.target) if args.clamp else None
    work.work_folder(args)  # --work is checked before the model loads
    if cost.announce(cost.plan_align(texts, clamp_path is not None, args.model), args):
        return 0
    model = common.load_cli_model(args, texts=texts)
    with common.usage_errors(FileNotFoundError, InterventionError):
        iv, control = load_clamp_pair(clamp_path, args.control, model)
    data = work.data_key(texts=texts)
    data |= {"clamp": work.hash_files(clamp_path), "control": work.hash_files(args.control)}
    checkpoints = work.open_checkpoints(args, model, data, skip=("clamp", "control", "layer"))
    t0 = time.time()
    with common.usage_errors(AlignmentError):
        opts = AlignOptions(
            target=args.target, centre=args.centre, layer=args.layer,
            batch_size=args.batch_size, max_tokens=args.max_tokens,
            side_effect_lines=args.side_effects_lines if args.side_effects else None,
            progress=not args.quiet,
        )  # fmt: skip
        run = run_alignment(model, texts, iv, control, opts, checkpoints=checkpoints)
    meta = common.run_meta(
        model,
        args,
        clamp=clamp_path,
        control=str(args.control or (Path(clamp_path).name + "-random" if control else None)),
        langs=list(texts),
        seconds=round(time.time() - t0, 1),
    )
    summary = run.summary(meta)
    report = align_report(run.comparison, summary, run.side_effects, layer=args.layer)
    run.write(args.out, meta=meta, extra={"report.html": report})
    outputs_written()
    work.finish_checkpoints(checkpoints)
    _print_alignment(summary)
    print(f"wrote {args.out}/summary.json, retrieval.csv and report.html")
    return 0


def _print_alignment(summary: dict[str, Any]) -> None:
    pre = summary["retrieval_top1"]["pre"]
    post = summary["retrieval_top1"].get("post", {})
    for pair in list(pre)[:12]:
        print(f"{pair}: {pre[pair]:.3f}" + (f" -> {post[pair]:.3f}" if pair in post else ""))
    for row in interval_rows(summary["intervals"]):
        print("  ".join(f"{k}={v}" for k, v in row.items()))

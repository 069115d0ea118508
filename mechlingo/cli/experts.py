"""``mechlingo experts`` and ``mechlingo align`` (expert neurons, cross-lingual alignment).

``mechlingo experts --target es --k 50,100,200,500,1000,2000 --parallel DIR --out EDIR`` finds the
expert neurons of ``es`` on the first ``--lines`` sentences of every language, saves the clamps
as ``EDIR/es-k100`` ... (and the random-neuron controls as ``EDIR/es-k100-random`` ...), the
top neurons (``experts.csv``), the k curve (``kcurve.csv``: BOS target-language rate with
Wilson intervals and held-out perplexity of every language with bootstrap intervals, for the
experts and the random control at every k), ``summary.json`` and ``report.html``. The k is
chosen by the papers' rule on the held-out lines that follow (``experts.choose_k``: highest
target rate among the k that keep the target's perplexity within ``--ppl-budget``, default
2x); ``summary.json`` has it under ``chosen_k`` and ``k_choice``, and the stricter rule that
bounds the other languages' perplexity too (``--ppl-others geomean``) under
``k_choice_stricter``. Finished stages (statistics, scores, clamps, each arm of each k) are
kept in ``.EDIR.work`` (or ``--work``) until ``EDIR`` is written; the same command run
again after a stop goes on from them, ``--fresh`` starts over (:mod:`mechlingo.cli.work`);
``align`` keeps its comparison the same way.

``mechlingo align --clamp EDIR --parallel DIR --out DIR`` (or ``--clamp EDIR/es-k500``) measures
retrieval and cosine distances before and after the clamp the rule chose (and after the
random control of the same k when it sits next to the clamp), per layer, and writes
``summary.json`` (``retrieval_top1`` and ``distance``, each ``pre``/``post``/``control``;
``intervals``: bootstrap intervals over sentences and paired gains over pre and over the
control) and ``report.html``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from mechlingo.activations.shards import memory_budget, shared_directory
from mechlingo.analyses.experts import (
    ExpertError,
    ExpertResult,
    collect_neuron_stats,
    k_curve,
    score_neurons,
)
from mechlingo.analyses.experts.align import (
    AlignmentComparison,
    AlignmentError,
    Embeddings,
    compare_alignment,
    drop_empty_lines,
)
from mechlingo.analyses.experts.run import ExpertsRun
from mechlingo.cli.common import (
    UsageError,
    add_model_args,
    add_out_arg,
    command,
    load_cli_model,
    run_meta,
    split_list,
)
from mechlingo.cli.flags import line_count, parse_ints
from mechlingo.cli.work import (
    add_work_args,
    data_key,
    finish_stages,
    hash_files,
    kcurve_cache,
    open_stages,
    staged_folder,
    staged_scores,
    staged_stats,
    work_folder,
)
from mechlingo.core.errors import ArtifactError, InputError
from mechlingo.core.stages import Stages
from mechlingo.core.types import Model
from mechlingo.core.untrusted import load_tensors
from mechlingo.data import LANGS, load_facts, parallel_sentences, read_parallel
from mechlingo.interventions import InterventionError, load_intervention
from mechlingo.report import write_outputs
from mechlingo.report.experts import align_report, experts_report, interval_rows
from mechlingo.scoring.side_effects import side_effects


def _data_args(p: argparse.ArgumentParser, default_lines: int) -> None:
    g = p.add_argument_group("data")
    g.add_argument(
        "--parallel",
        default=None,
        metavar="DIR",
        help="folder of line-aligned <lang>.txt files (e.g. NTREX), or a FLORES+ "
        "(<split>/<lang_Script>.parquet) or FLORES-200 (<split>/<lang_Script>.<split>) folder; "
        "default: the bundled parallel sentences",
    )
    g.add_argument(
        "--flores-split",
        choices=("dev", "devtest"),
        default="devtest",
        help="FLORES split to read from a FLORES --parallel folder (default devtest)",
    )
    g.add_argument(
        "--langs",
        default=None,
        help="comma-separated languages (default: every language with data: a language's "
        "experts are scored against all the others, and alignment is measured between every "
        "pair)",
    )
    g.add_argument(
        "--lines",
        type=line_count,
        default=default_lines,
        metavar="N",
        help=f"parallel lines (sentences) per language, after --offset (default {default_lines})",
    )
    g.add_argument(
        "--offset",
        type=line_count,
        default=0,
        metavar="N",
        help="skip this many lines first (keep expert-finding and evaluation sentences apart)",
    )
    g.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="keep only the first N tokens of each sentence (cheaper on CPU)",
    )


def load_parallel(args: Any, *, offset: int | None = None, limit: int | None = None) -> dict:
    """The parallel sentences selected by ``--parallel/--langs/--offset/--lines`` (lines that
    are empty in some language are dropped in all)."""

    langs = split_list(args.langs)
    main_call = offset is None and limit is None
    offset = args.offset if offset is None else offset
    limit = args.lines if limit is None else limit
    if limit is not None and limit < 1:
        raise UsageError("--lines must be at least 1")
    if offset < 0:
        raise UsageError("--offset must be >= 0")
    try:
        if args.parallel:
            texts = read_parallel(args.parallel, langs, getattr(args, "flores_split", "devtest"))
        else:
            texts = parallel_sentences(langs or list(LANGS))
    except ValueError as err:
        raise UsageError(str(err)) from err
    texts = drop_empty_lines(texts)
    out = {lg: s[offset : offset + limit if limit else None] for lg, s in texts.items()}
    if main_call:
        args._texts = out  # for the context-length check after the model loads
    short = [lg for lg, s in out.items() if not s]
    if short:
        raise UsageError(
            f"no sentences left for {short} after --offset {offset} (the data has "
            f"{len(next(iter(texts.values())))} lines)"
        )
    return out


# --------------------------------------------------------------------------------------


def _experts_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    _data_args(p, default_lines=300)
    add_out_arg(p)
    g = p.add_argument_group("experts")
    g.add_argument("--target", required=True, help="target language(s) of the expert "
                   "neurons, comma-separated")  # fmt: skip
    g.add_argument(
        "--k", default="50,100,200,500,1000,2000", help="expert counts to save and compare"
    )
    g.add_argument("--pool", choices=("mean", "max"), default="mean", help="pooling over tokens")
    g.add_argument("--score", choices=("auroc", "ap", "lape"), default="auroc",
                   help="how neurons are ranked as experts of the language: AUROC or average "
                   "precision of the pooled activation against the other languages, or LAPE "
                   "(activation-probability entropy)")  # fmt: skip
    g.add_argument("--value", choices=("mean", "median"), default="mean", help="clamp value")
    g.add_argument(
        "--layers", default=None, help="comma-separated layers to search (default all layers)"
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the random control and sampling")
    g.add_argument("--no-curve", action="store_true", help="skip the k curve (generation)")
    g.add_argument("--samples", type=int, default=32, help="samples from BOS per k (default 32)")
    g.add_argument("--max-new-tokens", type=int, default=20,
                   help="greedy tokens generated per BOS sample (default 20)")  # fmt: skip
    g.add_argument(
        "--heldout",
        type=line_count,
        default=16,
        metavar="N",
        help="held-out lines per language right after the --lines used, never fitted on "
        "(the k curve's perplexity; default 16)",
    )
    g.add_argument(
        "--ppl-budget",
        type=float,
        default=2.0,
        help="k rule: a clamp may raise the target language's held-out perplexity at most "
        "this many times (default 2)",
    )
    g.add_argument(
        "--ppl-others",
        choices=("geomean", "max", "none"),
        default="none",
        help="k rule: how the other languages' perplexity ratios enter the budget: not at all "
        "(default: the papers' rule, target rate against the target's perplexity), their "
        "geometric mean, or each of them (stricter rules; summary.json has the geomean "
        "rule's k beside as k_choice_stricter)",
    )
    g.add_argument(
        "--max-memory",
        default=None,
        metavar="SIZE",
        help="cap on the memory of the neuron statistics, e.g. 8G (default: a quarter of the "
        "memory available, shared by the ranks of this machine); when the pooled activations "
        "would take more than half of it they stream to disk shards and are scored a block "
        "of neurons at a time, with the same numbers (docs/scaling.md)",
    )
    g.add_argument(
        "--shard-dir",
        default=None,
        metavar="DIR",
        help="keep the statistics out of core in this empty folder (default: a temporary "
        "folder, removed afterwards, only when --max-memory calls for it); under torchrun "
        "every rank must see it",
    )
    add_work_args(p)


@command("experts", "expert (language-specific) neurons, clamps and the k curve", _experts_args)
def cmd_experts(args: Any) -> int:
    """``mechlingo experts``, with the out-of-core shard folder (if one is used) kept for the
    whole command and removed afterwards."""
    with _shard_folder(args):
        return _cmd_experts(args)


@contextlib.contextmanager
def _shard_folder(args: Any) -> Iterator[None]:
    """Sets ``args.shard_store``: ``--shard-dir``, or a temporary folder shared by the ranks
    (removed at the end), for :func:`_store_for`."""
    try:
        args.max_memory_bytes = memory_budget(args.max_memory)
    except InputError as err:
        raise UsageError(str(err), where="--max-memory", fix="e.g. --max-memory 8G") from err
    if args.shard_dir:
        args.shard_store = Path(args.shard_dir)
        yield
        return
    with shared_directory() as tmp:
        args.shard_store = tmp / "pooled"
        yield


def _store_for(model: Model, texts: dict, args: Any) -> Path | None:
    """Where the pooled activations go: ``None`` (memory) unless ``--shard-dir`` is given or
    they would take more than half of the ``--max-memory`` cap."""
    if getattr(args, "shard_store", None) is None:
        return None
    n_rows = sum(len(v) for v in texts.values())
    n_layers = len(parse_ints(args.layers, "--layers") or range(model.cfg.n_layers))
    need = 4 * n_rows * n_layers * int(model.cfg.d_mlp or 0)
    return args.shard_store if args.shard_dir or need > args.max_memory_bytes // 2 else None


def _cmd_experts(args: Any) -> int:

    targets, ks = _experts_flags(args)
    texts = load_parallel(args)
    missing = [t for t in targets if t not in texts]
    if missing:
        raise UsageError(f"no data for target language(s) {missing}; have {list(texts)}")
    if len(texts) < 2:
        raise UsageError("experts need at least two languages (the target and others)")
    heldout = None if args.no_curve else _heldout(args)  # checked before the expensive part
    work_folder(args)  # --work is checked before the model loads
    model = load_cli_model(args)
    stages = _experts_stages(args, model, texts, heldout)
    t0 = time.time()
    res, clamps = _find_and_clamp(model, texts, targets, ks, args, stages)
    curves = {}
    if heldout is not None:
        curves = {t: _k_curve(model, res, t, ks, heldout, args, stages) for t in targets}
    run = ExpertsRun(res, targets, ks, clamps, curves, args.ppl_budget, args.ppl_others)
    meta = run_meta(
        model,
        args,
        langs=list(texts),
        sentences_per_lang=len(next(iter(texts.values()))),
        seconds=round(time.time() - t0, 1),
    )
    summary = run.summary(meta)
    report = experts_report(
        res, summary, curves, summary["k_choice"], k_show=run.k_show, score=args.score
    )
    run.write(args.out, meta=meta, extra={"report.html": report})
    finish_stages(stages)
    for t, ch in summary["k_choice"].items():
        print(f"{t}: the k rule chose k = {ch['k']} ({ch['rule']})")
    print(f"wrote {args.out}: summary.json, experts.csv, report.html, clamps {sorted(clamps)}")
    return 0


def _experts_flags(args: Any) -> tuple[list[str], list[int]]:
    """The targets and the sorted distinct ``--k`` values, after the checks of the k rule's
    flags."""
    targets = split_list(args.target) or []
    ks = sorted(set(parse_ints(args.k, "--k", positive=True) or []))
    if not ks:
        raise UsageError(f"--k needs positive integers, got {args.k!r}")
    if not args.ppl_budget > 0 or args.ppl_budget == float("inf"):
        raise UsageError(f"--ppl-budget must be a positive number, got {args.ppl_budget}")
    if args.samples < 1:
        raise UsageError(f"--samples must be at least 1, got {args.samples}")
    return targets, ks


def _heldout(args: Any) -> dict:
    """The ``--heldout`` sentences after the first ``--lines`` (the k curve's perplexity)."""
    try:
        return load_parallel(args, offset=args.offset + args.lines, limit=args.heldout)
    except UsageError as err:
        raise UsageError(
            f"no held-out sentences for the k curve after the first {args.lines}: {err}; "
            "lower --lines or pass --no-curve"
        ) from err


def _experts_stages(args: Any, model: Model, texts: dict, heldout: dict | None) -> Stages:
    """The resumable stages of ``experts`` (:mod:`mechlingo.cli.work`): keyed by the model,
    the sentences, the held-out lines and every flag that changes a number (the targets and
    the k are in the stage names; the k rule's flags change no stored number)."""
    skip = ("target", "k", "no_curve", "ppl_budget", "ppl_others", "max_memory",
            "max_memory_bytes", "shard_dir")  # fmt: skip
    return open_stages(args, model, data_key(texts=texts, heldout=heldout), skip=skip)


def _staged_experts(model: Model, texts: dict, args: Any, stages: Stages) -> ExpertResult:
    """The pooled statistics (stage ``stats``; out of core they are recomputed: they live in
    the shard folder) and the scores (stage ``scores``) of every neuron."""
    store = _store_for(model, texts, args)
    mem = getattr(args, "max_memory_bytes", None)

    def collect() -> Any:
        return collect_neuron_stats(
            model, texts, pool=args.pool, layers=parse_ints(args.layers, "--layers"),
            batch_size=args.batch_size, max_tokens=args.max_tokens, progress=not args.quiet,
            store=store, max_memory=mem,
        )  # fmt: skip

    stats = collect() if store is not None else staged_stats(stages, "stats", collect)
    scores = staged_scores(stages, "scores", lambda: score_neurons(stats, max_memory=mem))
    return ExpertResult(stats, scores, args.score)


def _find_and_clamp(
    model: Model, texts: dict, targets: list[str], ks: list[int], args: Any, stages: Stages
) -> tuple[Any, dict[str, Path]]:
    """The expert neurons, and the saved clamps ``{target}-k{k}`` and their random controls
    ``{target}-k{k}-random`` of every target and k (each a stage ``clamp-NAME``)."""
    try:
        res = _staged_experts(model, texts, args, stages)
        clamps = {
            f"{t}-k{k}{suffix}": staged_folder(
                stages,
                f"clamp-{t}-k{k}{suffix}",
                lambda dest, t=t, k=k, fn=fn, kw=kw: fn(t, k, value=args.value, **kw).save(
                    dest, model
                ),
            )  # fmt: skip
            for t in targets
            for k in ks
            for suffix, fn, kw in (
                ("", res.clamp, {}),
                ("-random", res.random_clamp, {"seed": args.seed}),
            )
        }
    except (ExpertError, ValueError) as err:
        raise UsageError(str(err)) from err
    return res, clamps


def _k_curve(
    model: Model, res: Any, target: str, ks: list[int], heldout: dict, args: Any, stages: Stages
) -> Any:
    """The k curve of one target (BOS language rate and held-out perplexity per k; each arm
    of each k a stage ``kcurve-TARGET-ARM``)."""
    return k_curve(
        model,
        res,
        target,
        ks,
        heldout,
        n_samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        value=args.value,
        seed=args.seed,
        max_tokens=args.max_tokens or 64,
        progress=not args.quiet,
        cache=kcurve_cache(stages, f"kcurve-{target}-"),
    )


# --------------------------------------------------------------------------------------


def _resolve_clamp(path: str, target: str | None) -> str:
    """A clamp folder as given, or, for an ``experts`` output folder, the clamp of the k its
    rule chose for ``target`` (or its only target)."""

    p = Path(path)
    if (p / "intervention.json").is_file() or not (p / "summary.json").is_file():
        return path  # a clamp folder (or missing: load_intervention says so)
    chosen = json.loads((p / "summary.json").read_text()).get("chosen_k") or {}
    if target is None and len(chosen) == 1:
        target = next(iter(chosen))
    if target not in chosen:
        raise UsageError(
            f"{path} is an experts folder with chosen k for {sorted(chosen) or 'no language'}",
            where="--clamp",
            fix="pass --target LANG, or a clamp folder such as EDIR/es-k500",
        )
    k = chosen[target]
    if k is None:
        raise UsageError(
            f"the k rule of {path} chose no k for {target} (none within the perplexity budget)",
            where="--clamp",
            fix="pass a clamp folder such as EDIR/es-k100 explicitly (and say it was not chosen)",
        )
    return str(p / f"{target}-k{k}")


def _align_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    _data_args(p, default_lines=200)
    add_out_arg(p)
    g = p.add_argument_group("alignment")
    g.add_argument(
        "--clamp",
        default=None,
        help="saved intervention folder (e.g. EDIR/es-k500), or an `experts` output folder: "
        "then the clamp of the k its rule chose (`chosen_k` in EDIR/summary.json)",
    )
    g.add_argument(
        "--control",
        default=None,
        help="control intervention folder (default: CLAMP-random when it exists)",
    )
    g.add_argument(
        "--layer", type=int, default=None, help="layer of the headline numbers (default last)"
    )
    g.add_argument("--centre", action="store_true", help="subtract the mean embedding first")
    g.add_argument("--target", default=None, help="target language of the clamp's expert "
                   "neurons (default: from the clamp)")  # fmt: skip
    g.add_argument(
        "--side-effects",
        action="store_true",
        help="also measure the clamp's side effects in every language against the control "
        "(mechlingo.scoring.side_effects): accuracy on --side-effects-lines bundled "
        "capitals per language (natural templates), perplexity and output language on the "
        "last --side-effects-lines lines of each language",
    )
    g.add_argument("--side-effects-lines", type=int, default=20, metavar="N",
                   help="parallel lines per language that --side-effects measures perplexity "
                   "and output language on (default 20)")  # fmt: skip
    add_work_args(p)


def _align_side_effects(model: Model, iv: Any, control: Any, texts: dict, args: Any) -> Any:
    """The clamp's side effects (:func:`mechlingo.scoring.side_effects.side_effects`) on bundled
    capitals (natural templates) and the last ``--side-effects-lines`` lines of each language."""

    n = args.side_effects_lines
    langs = [lg for lg in texts if lg in LANGS]
    facts = load_facts(langs=langs, relations=["capital"], limit=n, templates="natural")
    lines = {lg: texts[lg][-n:] for lg in langs}
    return side_effects(model, iv, facts, lines, control=control or "random",
                        batch_size=args.batch_size, progress=not args.quiet)  # fmt: skip


@command("align", "cross-lingual retrieval and distances before/after a clamp", _align_args)
def cmd_align(args: Any) -> int:

    texts = load_parallel(args)
    if len(texts) < 2:
        raise UsageError("alignment needs at least two languages")
    if args.target is not None and args.target not in texts:
        raise UsageError(
            f"--target {args.target} has no sentences; the languages are {list(texts)}",
            where="--target",
            fix="pick one of them or drop --target",
        )
    clamp_path = _resolve_clamp(args.clamp, args.target) if args.clamp else None
    work_folder(args)  # --work is checked before the model loads
    model = load_cli_model(args)
    iv, control = _load_clamps(clamp_path, args.control, model)
    data = data_key(texts=texts) | {"clamp": hash_files(clamp_path),
                                    "control": hash_files(args.control)}  # fmt: skip
    stages = open_stages(args, model, data, skip=("clamp", "control", "layer"))
    t0 = time.time()
    comp, summary = _compare(model, texts, iv, control, args, stages)
    side = None
    if args.side_effects and iv is not None:
        side = _align_side_effects(model, iv, control, texts, args)
        summary["side_effects"] = side.to_json()
    summary["meta"] = run_meta(
        model,
        args,
        clamp=clamp_path,
        control=str(args.control or (Path(clamp_path).name + "-random" if control else None)),
        langs=list(texts),
        seconds=round(time.time() - t0, 1),
    )
    write_outputs(
        args.out,
        {
            "summary.json": summary,
            "retrieval.csv": comp.to_dataframe().to_csv(index=False),
            "report.html": align_report(comp, summary, side, layer=args.layer),
        },
    )
    finish_stages(stages)
    _print_alignment(summary)
    print(f"wrote {args.out}/summary.json, retrieval.csv and report.html")
    return 0


def _load_clamps(clamp_path: str | None, control_path: str | None, model: Model) -> tuple:
    """The clamp and its control (``--control``, or CLAMP-random when that folder exists);
    ``(None, None)`` without a clamp."""
    if not clamp_path:
        return None, None
    control = None
    try:
        iv = load_intervention(clamp_path, model)
        ctl = control_path or (str(Path(clamp_path)) + "-random")
        if control_path or Path(ctl).is_dir():
            control = load_intervention(ctl, model)
    except (FileNotFoundError, InterventionError) as err:
        raise UsageError(str(err)) from err
    return iv, control


def _compare(
    model: Model, texts: dict, iv: Any, control: Any, args: Any, stages: Stages
) -> tuple[Any, dict]:
    """Alignment before and after the clamp (and the control), as stage ``compare``: the
    comparison and its summary at ``--layer`` with bootstrap intervals."""
    try:
        comp = _staged_comparison(stages, lambda: compare_alignment(
            model, texts, iv, control=control, layers="all", target=args.target,
            centre=args.centre, batch_size=args.batch_size, max_tokens=args.max_tokens,
            progress=not args.quiet))  # fmt: skip
        summary = comp.summary(args.layer)
        summary["intervals"] = comp.intervals(args.layer)
    except (AlignmentError, ValueError) as err:
        raise UsageError(str(err)) from err
    summary["target"] = comp.target
    return comp, summary


_ARMS = ("pre", "post", "control")


def _staged_comparison(stages: Stages, compare: Callable[[], Any]) -> Any:
    """An :class:`~mechlingo.analyses.experts.align.AlignmentComparison` kept as a stage (its
    embeddings and retrieval matrices in a safetensors file)."""

    def fn(tmp: Path) -> dict[str, Any]:
        comp = compare()
        t: dict[str, Any] = {}
        for arm in _ARMS:
            emb, ret = comp._arm(arm)
            if emb is not None:
                t[f"{arm}.emb"], t[f"{arm}.retrieval"] = emb.emb, ret
        save_file({k: v.detach().cpu().contiguous() for k, v in t.items()},
                  str(tmp / "comparison.safetensors"))  # fmt: skip
        return {"langs": comp.langs, "layers": comp.layers, "target": comp.target,
                "centre": comp.centre, "meta": comp.meta}  # fmt: skip

    d = stages.run("compare", fn, folder=True)
    t = load_tensors(stages.path("compare") / "comparison.safetensors", ArtifactError,
                     finite=False, fix="delete the work folder (or rerun with --fresh)")  # fmt: skip

    def arm(name: str) -> tuple[Embeddings | None, Any]:
        if f"{name}.emb" not in t:
            return None, None
        return Embeddings(t[f"{name}.emb"], list(d["langs"]), list(d["layers"])), t[
            f"{name}.retrieval"]  # fmt: skip

    (pre, r_pre), (post, r_post), (ctl, r_ctl) = (arm(a) for a in _ARMS)
    return AlignmentComparison(pre, post, r_pre, r_post, d["target"], bool(d["centre"]),
                               dict(d["meta"]), ctl, r_ctl)  # fmt: skip


def _print_alignment(summary: dict[str, Any]) -> None:
    pre = summary["retrieval_top1"]["pre"]
    post = summary["retrieval_top1"].get("post", {})
    for pair in list(pre)[:12]:
        print(f"{pair}: {pre[pair]:.3f}" + (f" -> {post[pair]:.3f}" if pair in post else ""))
    for row in interval_rows(summary["intervals"]):
        print("  ".join(f"{k}={v}" for k, v in row.items()))

"""``mechlingo tuned-lens``: train a tuned lens (one language or a language-balanced mix).

Under ``torchrun --nproc_per_node N -m mechlingo.cli tuned-lens ...`` the training is
data-parallel (gradients all-reduced); rank 0 writes the folder. The folder holds the lens
(``translators.safetensors``, ``tuned_lens.json``: the model fingerprint and the training
settings), ``loss.csv`` (the loss curve), ``summary.json`` and ``report.html`` (the loss
curve figure and, with ``--heldout N``, the held-out KL per layer against the logit lens).
Use it with ``mechlingo lens --decoder tuned --tuned-lens DIR``. The training and the
held-out KL are checkpoints kept in ``.OUT.work`` until ``OUT`` is written: the same command run
again after a stop goes on from them (:mod:`mechlingo.cli.work`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mechlingo.analyses.decoders.options import TrainingOptions
from mechlingo.analyses.decoders.run import run_tuned_lens
from mechlingo.analyses.decoders.tuned_lens import mix_texts
from mechlingo.cli import common, cost, work
from mechlingo.cli.experts import add_heldout_arg, add_line_args
from mechlingo.cli.glossary import about
from mechlingo.cli.streams import outputs_written
from mechlingo.data import LANGS
from mechlingo.data.io import read_parallel_dir, read_text
from mechlingo.data.prompts import parallel_sentences
from mechlingo.report import Report


def _spans(args: argparse.Namespace) -> tuple[slice, slice]:
    """The training lines (``--offset``, ``--lines``) and the ``--heldout`` lines right after
    them."""
    stop = args.offset + args.lines
    return slice(args.offset, stop), slice(stop, stop + args.heldout)


def _tuned_args(p: argparse.ArgumentParser) -> None:
    common.add_model_args(p)
    common.add_out_arg(p)
    g = p.add_argument_group("training text")
    common.add_parallel_arg(g, "default: the bundled fact sentences")
    g.add_argument("--text-file", default=None, help=about("--text-file", "instead of "
                   "--parallel (default: none)"))  # fmt: skip
    add_line_args(g)  # --langs: several = a language-balanced mix
    add_heldout_arg(g)
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=60, help=about("--steps"))
    t.add_argument("--max-seconds", type=float, default=None, help=about("--max-seconds",
                   "default: no time cap"))  # fmt: skip
    t.add_argument("--texts-per-step", type=int, default=8, help=about("--texts-per-step"))
    t.add_argument("--lr", type=float, default=1e-3, help=about("--lr"))
    t.add_argument("--vocab-sample", default="auto", help=about("--vocab-sample", "auto = "
                   "exact up to 32,768 tokens"))  # fmt: skip
    t.add_argument("--seed", type=int, default=0, help=about("--seed"))
    work.add_work_args(p)
    cost.add_dry_run_arg(p)


def _texts(args: argparse.Namespace) -> tuple[dict[str, list[str]], str]:
    """``{lang: lines}`` of the training text and a description of where it came from."""
    if args.text_file:
        path = Path(args.text_file)
        if not path.is_file():
            raise common.UsageError(f"--text-file {path} is not a file")
        lines = [x for x in read_text(path, "text file").split("\n") if x.strip()]
        return {"text": lines}, str(path)
    langs = common.parallel_langs(args)
    if args.parallel:
        return read_parallel_dir(args.parallel, langs), str(args.parallel)
    return parallel_sentences(langs or list(LANGS)), "bundled facts"


def _span_text(span: slice) -> str | None:
    """``START:STOP`` of the training lines (as the lens's meta recorded them before the
    flags were counts), ``None`` for all lines."""
    if span.start == 0 and span.stop is None:
        return None
    return f"{span.start}:{'' if span.stop is None else span.stop}"


def _vocab_sample(text: str) -> int | str | None:
    if text in ("auto", "exact"):
        return None if text == "exact" else "auto"
    try:
        return int(text)
    except ValueError:
        raise common.UsageError(
            f"--vocab-sample {text!r} is not 'exact', 'auto' or an integer"
        ) from None


def options_from_args(args: argparse.Namespace) -> TrainingOptions:
    """``tuned-lens``' training flags as
    :class:`~mechlingo.analyses.decoders.options.TrainingOptions` (checked there)."""
    return TrainingOptions(
        steps=args.steps, max_seconds=args.max_seconds, lr=args.lr,
        texts_per_step=args.texts_per_step, max_tokens=args.max_tokens,
        vocab_sample=_vocab_sample(args.vocab_sample), seed=args.seed, progress=not args.quiet,
    )  # fmt: skip


@common.command("tuned-lens", "train a tuned lens (one language or a balanced mix)", _tuned_args)
def cmd_tuned_lens(args: argparse.Namespace) -> int:

    if args.parallel and args.text_file:
        raise common.UsageError("give --parallel or --text-file, not both")
    train_span, held_span = _spans(args)
    training = options_from_args(args)
    by_lang, source = _texts(args)
    train = mix_texts({lg: v[train_span] for lg, v in by_lang.items()})
    held_by_lang = {lg: v[held_span] for lg, v in by_lang.items()}
    if all(any(t.strip() for t in v) for v in held_by_lang.values()):
        held = mix_texts(held_by_lang)
    else:
        held = []
        print(f"note: no --heldout lines after line {held_span.start} in every language: no "
              "held-out KL (give fewer --lines to keep some)", file=sys.stderr)  # fmt: skip
    work.work_folder(args)  # --work is checked before the model loads
    plan = cost.plan_tuned_lens(args.steps, args.texts_per_step, len(held), args.model)
    if cost.announce(plan, args):
        return 0
    model = common.load_cli_model(args)
    checkpoints = work.open_checkpoints(args, model, work.data_key(train=train, held=held))
    t0 = time.time()
    run = run_tuned_lens(
        model, train, held, langs=list(by_lang), text=source, lines=_span_text(train_span),
        training=training, batch_size=args.batch_size, checkpoints=checkpoints,
    )  # fmt: skip
    meta = common.run_meta(model, args, seconds=round(time.time() - t0, 1))
    report = Report("mechlingo: tuned lens training", meta)
    for label, value in run.headline():
        report.add_headline(label, value)
    for heading, fig in run.figures():
        report.add_heading(heading)
        report.add_figure(fig)
    run.write(args.out, meta=meta, extra={"report.html": report})
    outputs_written()
    work.finish_checkpoints(checkpoints)
    tr = run.training
    print(f"trained {len(tr.tokens)} steps, {sum(tr.tokens)} tokens in {tr.seconds:.0f}s on "
          f"{tr.world_size} process(es); wrote {args.out}")  # fmt: skip
    return 0

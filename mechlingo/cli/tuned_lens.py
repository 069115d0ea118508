"""``mechlingo tuned-lens``: train a tuned lens (one language or a language-balanced mix).

Under ``torchrun --nproc_per_node N -m mechlingo.cli tuned-lens ...`` the training is
data-parallel (gradients all-reduced); rank 0 writes the folder. The folder holds the lens
(``translators.safetensors``, ``tuned_lens.json``: the model fingerprint and the training
settings), ``loss.csv`` (the loss curve), ``summary.json`` and ``report.html`` (the loss
curve figure and, with ``--heldout N``, the held-out KL per layer against the logit lens).
Use it with ``mechlingo lens --decoder tuned --tuned-lens DIR``. The training and the
held-out KL are stages kept in ``.OUT.work`` until ``OUT`` is written: the same command run
again after a stop goes on from them (:mod:`mechlingo.cli.work`).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch

from mechlingo.analyses.decoders.tuned_lens import (
    TunedLensTraining,
    lens_divergence,
    load_tuned_lens,
    mix_texts,
    train_tuned_lens,
)
from mechlingo.cli.common import (
    UsageError,
    add_model_args,
    add_out_arg,
    command,
    load_cli_model,
    run_meta,
    split_list,
)
from mechlingo.cli.flags import line_count
from mechlingo.cli.work import add_work_args, data_key, finish_stages, open_stages, work_folder
from mechlingo.core.stages import Stages
from mechlingo.data import LANGS
from mechlingo.data.io import read_parallel_dir, read_text
from mechlingo.data.prompts import parallel_sentences
from mechlingo.report import Report, write_outputs
from mechlingo.viz.lens import lens_kl_figure


def _spans(args: Any) -> tuple[slice, slice | None]:
    """The training lines (``--offset``, ``--lines``) and the held-out lines right after
    them (``--heldout``; ``None`` without it)."""
    start = args.offset
    stop = None if args.lines is None else start + args.lines
    if args.heldout is None:
        return slice(start, stop), None
    if stop is None:
        raise UsageError(
            "--heldout takes the lines after the training lines, but no --lines says where "
            "they end",
            where="--heldout",
            fix="add --lines N (e.g. --lines 800 --heldout 100)",
        )
    return slice(start, stop), slice(stop, stop + args.heldout)


def _tuned_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_out_arg(p, batch_size=8, batch_reason="texts per forward pass of the held-out KL; "
                "training texts are longer than fact prompts")  # fmt: skip
    g = p.add_argument_group("training text")
    g.add_argument("--parallel", default=None, metavar="DIR", help="folder of line-aligned "
                   "<lang>.txt files (e.g. NTREX or FLORES); default: the bundled fact "
                   "sentences")  # fmt: skip
    g.add_argument("--text-file", default=None, help="your own text, one training text a line "
                   "(instead of --parallel)")  # fmt: skip
    g.add_argument("--langs", default="en", help="languages to train on (default en: a lens "
                   "of one language unless a mix is asked for); several = a language-balanced "
                   "mix, 'all' = every language of --parallel")  # fmt: skip
    g.add_argument("--offset", type=line_count, default=0, metavar="N",
                   help="skip this many lines of each file first (default 0)")  # fmt: skip
    g.add_argument("--lines", type=line_count, default=None, metavar="N",
                   help="parallel lines (sentences) per language to train on, after --offset "
                   "(default: all)")  # fmt: skip
    g.add_argument("--heldout", type=line_count, default=None, metavar="N",
                   help="held-out lines per language right after the --lines used, never "
                   "fitted on: the held-out KL per layer against the logit lens")  # fmt: skip
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=60, help="optimizer steps (default 60)")
    t.add_argument("--max-seconds", type=float, default=None, help="stop after this long")
    t.add_argument("--texts-per-step", type=int, default=8, help="texts per step (default 8)")
    t.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    t.add_argument("--max-tokens", type=int, default=48, help="tokens per text (default 48)")
    t.add_argument("--vocab-sample", default="auto", help="'exact' (whole vocabulary), an "
                   "int (sampled remainder) or 'auto' (exact up to 32,768 tokens)")  # fmt: skip
    t.add_argument("--seed", type=int, default=0, help="text order and samples (default 0)")
    add_work_args(p)


def _texts(args: Any) -> tuple[dict[str, list[str]], str]:
    """``{lang: lines}`` of the training text and a description of where it came from."""
    if args.text_file:
        path = Path(args.text_file)
        if not path.is_file():
            raise UsageError(f"--text-file {path} is not a file")
        lines = [x for x in read_text(path, "text file").split("\n") if x.strip()]
        return {"text": lines}, str(path)
    langs = split_list(args.langs) or ["en"]
    if args.parallel:
        by_lang = read_parallel_dir(args.parallel, None if langs == ["all"] else langs)
        return by_lang, str(args.parallel)
    return parallel_sentences(list(LANGS) if langs == ["all"] else langs), "bundled facts"


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
        raise UsageError(f"--vocab-sample {text!r} is not 'exact', 'auto' or an integer") from None


@command("tuned-lens", "train a tuned lens (one language or a balanced mix)", _tuned_args)
def cmd_tuned_lens(args: Any) -> int:

    if args.parallel and args.text_file:
        raise UsageError("give --parallel or --text-file, not both")
    train_span, held_span = _spans(args)
    sample = _vocab_sample(args.vocab_sample)
    by_lang, source = _texts(args)
    train = mix_texts({lg: v[train_span] for lg, v in by_lang.items()})
    held = mix_texts({lg: v[held_span] for lg, v in by_lang.items()}) if held_span else []
    work_folder(args)  # --work is checked before the model loads
    model = load_cli_model(args)
    stages = open_stages(args, model, data_key(train=train, held=held))
    t0 = time.time()
    kw = {"steps": args.steps, "max_seconds": args.max_seconds, "lr": args.lr,
          "texts_per_step": args.texts_per_step, "max_tokens": args.max_tokens,
          "vocab_sample": sample, "seed": args.seed, "progress": not args.quiet}  # fmt: skip
    training = _staged_training(stages, model, train, kw)
    lens = training.lens
    lens.meta |= {"text": source, "langs": list(by_lang), "lines": _span_text(train_span)}
    summary = {"training": training.summary(), "langs": list(by_lang), "text": source}
    if held:
        div = stages.run("heldout", lambda: lens_divergence(
            model, held, {"logit": None, "tuned": lens}, batch_size=args.batch_size))  # fmt: skip
        summary["heldout_kl"] = div
    summary["meta"] = run_meta(model, args, seconds=round(time.time() - t0, 1))
    report = Report("mechlingo: tuned lens training", summary["meta"])
    _headline(report, summary)
    report.add_heading("Loss curve")
    report.add_figure(training.fig_loss())
    if held:
        report.add_heading("Held-out KL(final || lens) per layer")
        report.add_figure(lens_kl_figure(summary["heldout_kl"]))
    files = lens.files() | {"summary.json": summary, "loss.csv": _loss_csv(training)}
    write_outputs(args.out, files | {"report.html": report}, keep_others=False)
    finish_stages(stages)
    print(f"trained {len(training.tokens)} steps, {sum(training.tokens)} tokens in "
          f"{training.seconds:.0f}s on {training.world_size} process(es); wrote {args.out}")  # fmt: skip
    return 0


def _staged_training(
    stages: Stages, model: Any, train: list[str], kw: dict[str, Any]
) -> TunedLensTraining:
    """The training as stage ``train`` (the lens saved in the stage folder, the loss curve
    in its result), read back through :func:`load_tuned_lens` and its checks."""

    def fn(tmp: Path) -> dict[str, Any]:
        tr = train_tuned_lens(model, train, **kw)
        tr.lens.save(tmp / "lens")
        return {"loss": tr.loss.tolist(), "tokens": tr.tokens, "seconds": tr.seconds,
                "world_size": tr.world_size, "config": tr.config}  # fmt: skip

    d = stages.run("train", fn, folder=True)
    lens = load_tuned_lens(stages.path("train") / "lens", model)
    loss = torch.tensor(
        [[math.nan if v is None else v for v in row] for row in d["loss"]], dtype=torch.float32
    )
    return TunedLensTraining(lens, loss, list(d["tokens"]), float(d["seconds"]),
                             int(d["world_size"]), dict(d["config"]))  # fmt: skip


def _headline(report: Report, summary: dict[str, Any]) -> None:
    """Steps and tokens, the mean loss over the entries at the start and at the end, and the
    held-out KL of the tuned lens against the logit lens (mean over the entries)."""
    t = summary["training"]
    report.add_headline("Training", f"{t['steps']} steps, {t['tokens']} tokens, "
                        f"{len(summary['langs'])} language(s)")  # fmt: skip

    def mean(xs: Any) -> float:
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else float("nan")

    report.add_headline("Mean KL per entry, first -> last steps",
                        f"{mean(t['loss_first_steps']):.3f} -> {mean(t['loss_last_steps']):.3f}")  # fmt: skip
    kl = summary.get("heldout_kl", {}).get("decoders", {})
    if kl:
        report.add_headline("Held-out KL(final || lens), mean over entries",
                            ", ".join(f"{d} {mean(v['kl']):.3f}" for d, v in kl.items()))  # fmt: skip


def _loss_csv(training: Any) -> str:
    """``step,entry,kl,tokens`` rows of the loss curve."""
    rows = ["step,entry,kl,tokens"]
    for s, row in enumerate(training.loss.tolist()):
        rows += [f"{s},{e},{v:.6g},{training.tokens[s]}" for e, v in enumerate(row)]
    return "\n".join(rows) + "\n"

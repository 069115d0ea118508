"""``mechlingo lens --decoder logit,tuned,patchscope``: the lens under several decoders (any
registered in :mod:`mechlingo.analyses.decoders.registry`).

The flags are added to ``mechlingo lens`` (:mod:`mechlingo.cli.lens`); with only the
default ``--decoder logit`` the command writes exactly what it always wrote. With several
decoders it is one call, :func:`mechlingo.analyses.decoders.run.run_lens_decoders`; the outputs gain a ``decoder`` column (``lens.csv``), a summary and an
English-lead table per decoder (``summary.json``) and the side-by-side curves
(``report.html``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlingo.analyses.decoders.registry import decoder_entry, decoder_names, get_decoder
from mechlingo.analyses.decoders.run import run_lens_decoders
from mechlingo.cli.common import UsageError, run_meta, split_list
from mechlingo.cli.glossary import about
from mechlingo.cli.streams import outputs_written
from mechlingo.core.types import Model
from mechlingo.report.decoders import decoders_report

__all__ = ["DecoderChoice", "add_decoder_args", "decoder_choice", "parse_decoders", "run_decoders"]


def add_decoder_args(p: argparse.ArgumentParser) -> None:
    """``--decoder``, ``--tuned-lens``, ``--patchscope-target``, ``--patchscope-tokens``."""
    g = p.add_argument_group("decoders")
    listed = "; ".join(f"{n} ({decoder_entry(n).help})" if decoder_entry(n).help else n
                       for n in decoder_names())  # fmt: skip
    g.add_argument("--decoder", default="logit", help=about("--decoder", f"{listed}; several "
                   "are drawn side by side"))  # fmt: skip
    g.add_argument("--tuned-lens", default=None, help=about("--tuned-lens", "NAME=DIR,NAME=DIR "
                   "for several (decoders tuned-NAME); default: none"))  # fmt: skip
    g.add_argument("--patchscope-target", default=None, help=about("--patchscope-target",
                   "default: each prompt's own language"))  # fmt: skip
    g.add_argument("--patchscope-tokens", type=int, default=0, help=about("--patchscope-tokens",
                   "0 = its first token only, no generation; with --decoder patchscope"))  # fmt: skip


def _tuned_paths(text: str | None) -> dict[str, Path]:
    if not text:
        return {}
    out = {}
    for item in split_list(text) or []:
        name, eq, path = item.partition("=")
        label, folder = ("tuned-" + name, Path(path)) if eq else ("tuned", Path(name))
        if not (folder / "tuned_lens.json").is_file():
            raise UsageError(f"--tuned-lens {folder} holds no tuned lens (tuned_lens.json)",
                             fix="train one with `mechlingo tuned-lens --out DIR`")  # fmt: skip
        out[label] = folder
    return out


@dataclass(frozen=True)
class DecoderChoice:
    """The decoders of ``mechlingo lens``: ``labels`` in order (``tuned`` expanded to one per
    ``--tuned-lens``) and ``tuned_paths``, the lens folder of each ``tuned`` label."""

    labels: list[str]
    tuned_paths: dict[str, Path] = field(default_factory=dict)


def parse_decoders(args: argparse.Namespace) -> list[str]:
    """The decoder labels of ``--decoder`` (:attr:`DecoderChoice.labels`)."""
    return decoder_choice(args).labels


def decoder_choice(args: argparse.Namespace) -> DecoderChoice:
    """The decoders of ``--decoder`` and ``--tuned-lens``, checked before the model loads."""
    names = split_list(getattr(args, "decoder", None)) or ["logit"]
    known = decoder_names()
    bad = [n for n in names if n not in known]
    if bad or len(set(names)) != len(names):
        raise UsageError(f"--decoder {args.decoder!r}: choose distinct names from "
                         f"{', '.join(known)}")  # fmt: skip
    tuned = _tuned_paths(getattr(args, "tuned_lens", None))
    if "tuned" in names and not tuned:
        raise UsageError("--decoder tuned needs --tuned-lens DIR")
    if tuned and "tuned" not in names:
        raise UsageError("--tuned-lens is given but --decoder does not include tuned")
    if getattr(args, "patchscope_tokens", 0) < 0:
        raise UsageError("--patchscope-tokens must be >= 0")
    if getattr(args, "patchscope_tokens", 0) and "patchscope" not in names:
        raise UsageError("--patchscope-tokens is the patchscope's continuation length",
                         where="--patchscope-tokens",
                         fix="add --decoder patchscope, or drop --patchscope-tokens")  # fmt: skip
    out = []
    for n in names:
        out += list(tuned) if n == "tuned" else [n]
    return DecoderChoice(out, tuned)


def run_decoders(
    args: argparse.Namespace,
    model: Model,
    facts: list[Any],
    choice: DecoderChoice,
    track: list[str],
) -> int:
    """The lens under several decoders (:func:`~mechlingo.analyses.decoders.run.run_lens_decoders`):
    ``summary.json`` (per decoder: the lens summary and where English leads), ``lens.csv``
    (with a ``decoder`` column) and ``report.html``."""
    t0 = time.time()
    spec: dict[str, Any] = {}
    decoders = choice.labels
    for label in decoders:
        name = "tuned" if label in choice.tuned_paths else label
        spec[label] = get_decoder(name, model, tuned_lens=choice.tuned_paths.get(label),
                                  target=args.patchscope_target,
                                  max_new_tokens=args.patchscope_tokens)  # fmt: skip
    run = run_lens_decoders(model, facts, spec, track_langs=track, max_rank=args.max_rank,
                            batch_size=args.batch_size, progress=not args.quiet)  # fmt: skip
    meta = run_meta(model, args, n_facts=len(facts), decoders=decoders,
                    seconds=round(time.time() - t0, 1))  # fmt: skip
    summary = run.summary(meta)
    run.write(args.out, meta=meta, extra={"report.html": decoders_report(run.comparison, summary)})
    outputs_written()
    print(f"wrote {args.out}/summary.json, lens.csv and report.html ({', '.join(decoders)})")
    return 0

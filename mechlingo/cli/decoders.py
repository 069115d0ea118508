"""``mechlingo lens --decoder NAME[,NAME...]``: the lens under several decoders, every one
built from the registry (:mod:`mechlingo.analyses.decoders.registry`).

The flags are added to ``mechlingo lens`` (:mod:`mechlingo.cli.lens`): ``--decoder`` (its
names and its default from the registry) and each registered decoder's declared options
(``--tuned-lens``, ``--patchscope-target``, ``--patchscope-tokens``, and those of any decoder
registered later), with their help and defaults. With only the default decoder the command
writes exactly what it always wrote. With several decoders it is one call,
:func:`mechlingo.analyses.decoders.run.run_lens_decoders`; the outputs gain a ``decoder``
column (``lens.csv``), a summary and an English-lead table per decoder (``summary.json``) and
the side-by-side curves (``report.html``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from mechlingo.analyses.decoders.registry import (
    DecoderOption,
    DecoderSpec,
    DecoderUse,
    decoder_names,
    decoder_specs,
    default_decoder,
)
from mechlingo.analyses.decoders.run import run_lens_decoders
from mechlingo.cli.common import UsageError, run_meta, split_list
from mechlingo.cli.glossary import FLAGS, about
from mechlingo.cli.streams import outputs_written
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.report.decoders import decoders_report

__all__ = ["DecoderChoice", "add_decoder_args", "decoder_choice", "parse_decoders", "run_decoders"]


def _options() -> Iterator[tuple[DecoderOption, list[str]]]:
    """Each declared option once (by flag), with the decoders that declare it."""
    seen: dict[str, tuple[DecoderOption, list[str]]] = {}
    for spec in decoder_specs():
        for o in spec.options:
            seen.setdefault(o.flag, (o, []))[1].append(spec.name)
    yield from seen.values()


def add_decoder_args(p: argparse.ArgumentParser) -> None:
    """``--decoder`` and every registered decoder's options, from the registry."""
    g = p.add_argument_group("decoders")
    default = default_decoder()
    listed = "; ".join(f"{s.name} ({s.help})" if s.help else s.name for s in decoder_specs())
    g.add_argument("--decoder", default=default, help=about("--decoder", f"read every layer "
                   f"with: {listed}; several are drawn side by side".replace("%", "%%")))  # fmt: skip
    for o, owners in _options():
        why = f": {o.why_default}" if o.why_default else ""
        unset = f"; default: {o.why_default or 'none'}"  # what an unset option means
        shown = unset if o.default is None else f"; default {o.default}{why}"
        detail = f"with --decoder {' or '.join(owners)}{shown}"
        # a flag of the glossary takes its one meaning from there (mechlingo.cli.glossary);
        # another registered decoder's option says its own help
        text = about(o.flag, detail.replace("%", "%%")) if o.flag in FLAGS else (
            f"{o.help} ({detail})".replace("%", "%%"))  # fmt: skip
        g.add_argument(o.flag, type=str if o.per_label else o.type, default=o.default,
                       help=text)  # fmt: skip


@dataclass(frozen=True)
class DecoderChoice:
    """The decoders of ``mechlingo lens``, in order: one :class:`DecoderUse` per label (a
    decoder whose option takes ``NAME=VALUE`` items, the tuned lens, gives one per item)."""

    uses: list[DecoderUse]

    @property
    def labels(self) -> list[str]:
        """The labels of the results, in order."""
        return [u.label for u in self.uses]


def parse_decoders(args: argparse.Namespace) -> list[str]:
    """The decoder labels of ``--decoder`` (:attr:`DecoderChoice.labels`)."""
    return decoder_choice(args).labels


def _checked(o: DecoderOption, value: Any) -> Any:
    try:
        return o.check(value)
    except InputError as err:
        raise UsageError(err.message, where=err.where or o.flag, fix=err.fix) from None


def _per_label(spec: DecoderSpec, o: DecoderOption, text: str) -> list[tuple[str, Any]]:
    """``VALUE`` or ``NAME=VALUE,...`` of a per-label option: (label, checked value)."""
    out = []
    for item in split_list(text) or []:
        name, eq, value = item.partition("=")
        label, value = (f"{spec.name}-{name}", value) if eq else (spec.name, name)
        out.append((label, _checked(o, o.type(value))))
    return out


def _uses(spec: DecoderSpec, args: argparse.Namespace) -> list[DecoderUse]:
    """The uses of one chosen decoder: its options from ``args``, checked."""
    values: dict[str, Any] = {}
    split: tuple[DecoderOption, list[tuple[str, Any]]] | None = None
    for o in spec.options:
        value = getattr(args, o.dest, o.default)
        if o.per_label and isinstance(value, str):
            split = (o, _per_label(spec, o, value))
            value = split[1][0][1] if split[1] else None
        values[o.keyword] = _checked(o, value)
    need = spec.missing(values)
    if need is not None:
        raise UsageError(f"--decoder {spec.name} needs {need.flag}", where=need.flag,
                         fix=need.fix or f"give {need.flag}")  # fmt: skip
    if split is None:
        return [DecoderUse(spec.name, spec.name, values)]
    o, items = split
    return [DecoderUse(label, spec.name, {**values, o.keyword: v}) for label, v in items]


def decoder_choice(args: argparse.Namespace) -> DecoderChoice:
    """The decoders of ``--decoder`` with their options, checked before the model loads: known
    and distinct names, each option in range, the required ones given, and no option of a
    decoder that is not chosen."""
    names = split_list(getattr(args, "decoder", None)) or [default_decoder()]
    known = decoder_names()
    bad = [n for n in names if n not in known]
    if bad or len(set(names)) != len(names):
        raise UsageError(f"--decoder {args.decoder!r}: choose distinct names from "
                         f"{', '.join(known)}")  # fmt: skip
    for o, owners in _options():
        value = getattr(args, o.dest, o.default)
        if value != o.default and not set(owners) & set(names):
            raise UsageError(f"{o.flag} is an option of --decoder {' or '.join(owners)}, which "
                             "--decoder does not include", where=o.flag,
                             fix=f"add --decoder {owners[0]}, or drop {o.flag}")  # fmt: skip
    specs = {s.name: s for s in decoder_specs()}
    return DecoderChoice([u for n in names for u in _uses(specs[n], args)])


def build_decoders(model: Model, uses: Sequence[DecoderUse]) -> dict[str, Any]:
    """``{label: decoder}`` for ``model`` (each built and checked)."""
    return {u.label: u.build(model) for u in uses}


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
    decoders = choice.labels
    run = run_lens_decoders(model, facts, build_decoders(model, choice.uses), track_langs=track,
                            max_rank=args.max_rank, batch_size=args.batch_size,
                            progress=not args.quiet)  # fmt: skip
    meta = run_meta(model, args, n_facts=len(facts), decoders=decoders,
                    seconds=round(time.time() - t0, 1))  # fmt: skip
    summary = run.summary(meta)
    run.write(args.out, meta=meta, extra={"report.html": decoders_report(run.comparison, summary)})
    outputs_written()
    print(f"wrote {args.out}/summary.json, lens.csv and report.html ({', '.join(decoders)})")
    return 0

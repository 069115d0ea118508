"""Parsers of comma-separated flag values: the one place where ``--langs``, ``--k``,
``--control-seeds``, ``--task-alphas``, ``--split``, ``--mid-layers``, ``--config`` ... are split
and converted.

Every parser names the flag in its error (an :class:`~mechlingo.core.errors.InputError`,
printed by the ``mechlingo`` command as one line with exit status 2) and leaves ``None`` as
``None`` (the flag was not given). This module imports nothing else from
:mod:`mechlingo.cli`, so the checks (:mod:`mechlingo.cli.validate`) and the commands share it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Sequence

from mechlingo.core.errors import InputError

#: the largest integer of a comma-separated flag (layers, counts, seeds)
MAX_LIST_INT = 2**32 - 1
#: the most values an ``A-B`` range may span
MAX_RANGE = 4096

__all__ = [
    "INT_LIMITS",
    "DefaultsHelpFormatter",
    "HelpParser",
    "check_finite",
    "check_int_limits",
    "parse_config",
    "parse_floats",
    "parse_int_range",
    "parse_ints",
    "parse_list",
    "count_or_all",
]

# Every integer flag's largest value, with what it counts: each is far beyond a real run and
# still small enough that what the flag sizes (a list of texts, a batch of prompts, a
# generation) fits a machine's memory, so an absurd value is refused at parse, before
# anything is allocated (`--texts-per-step 2000000000` would build a list of two billion
# texts). A new integer flag must be added here (tests/system/test_bad_inputs.py checks
# every integer flag of the parser). Seeds are exempt (any 64-bit integer is a seed).
_ITEMS = 2**24  # 16,777,216 facts, lines, ids or steps: a list of pointers of 128 MiB
_BATCH = 2**16  # prompts, texts or cells in one forward pass
_TOKENS = 2**21  # tokens of one prompt or generation: more than any model's context
_LAYERS = 4096  # as the layer bound of a saved intervention
INT_LIMITS: dict[str, tuple[int, str]] = {
    "limit": (_ITEMS, "facts per relation; --limit all reads every fact"),
    "per_relation": (_ITEMS, "fact ids per relation"),
    "dev_per_lang": (_ITEMS, "fact ids per relation"),
    "test_per_lang": (_ITEMS, "fact ids per relation"),
    "screen_ids": (_ITEMS, "fact ids"),
    "lines": (_ITEMS, "lines per language"),
    "heldout": (_ITEMS, "lines per language"),
    "offset": (_ITEMS, "lines skipped"),
    "side_effects_lines": (_ITEMS, "lines per language"),
    "steps": (_ITEMS, "optimizer steps"),
    "samples": (_BATCH, "generated samples per k"),
    "batch_size": (_BATCH, "prompts in one forward pass"),
    "texts_per_step": (_BATCH, "texts in one optimizer step"),
    "cells_per_batch": (_BATCH, "patched copies in one forward pass"),
    "patch_prompts": (_BATCH, "prompts per language"),
    "top_k": (_BATCH, "settings re-scored"),
    "verify_heads": (_BATCH, "heads verified"),
    "verify_edges": (_ITEMS, "edges verified"),
    "ig_steps": (_BATCH, "integrated-gradient steps, each a copy of the batch"),
    "circuit_prompts": (_BATCH, "prompts per language"),
    "repeats": (_BATCH, "re-splits, each building its vectors again"),
    "max_rank": (_ITEMS, "a rank within a vocabulary"),
    "max_new_tokens": (_TOKENS, "tokens generated per prompt"),
    "patchscope_tokens": (_TOKENS, "tokens the patchscope generates per layer"),
    "sample_tokens": (_TOKENS, "tokens generated per BOS sample"),
    "max_tokens": (_TOKENS, "tokens per text"),
    "k_shot": (_LAYERS, "demonstrations in one prompt"),
    "translation_shots": (_LAYERS, "translation pairs in one prompt"),
    "layer": (_LAYERS, "a layer index, either sign"),
}
#: integer flags with no bound of their own (a seed may be any 64-bit integer)
UNBOUNDED_INTS = ("seed",)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """The one place where ``--help`` shows defaults: every option whose default is a
    value gets ``(default: X)`` after its help, unless the help already names its default.
    Nothing is added for switches (``store_true``: off unless given) and ``None`` defaults
    (the help says what happens when the flag is omitted)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        shown = "%(default)" in text or "default" in text.lower()
        if (
            shown
            or not action.option_strings
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class HelpParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose help shows defaults
    (:class:`DefaultsHelpFormatter`) and that takes flags by their whole name only (no
    abbreviations: ``--lang`` must not quietly become ``--langs``); subcommand parsers made
    from it are of the same kind."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def parse_list(
    text: str | None,
    flag: str,
    *,
    known: Sequence[str] | None = None,
    what: str = "item",
    allow_empty: bool = False,
    unique: bool = True,
) -> list[str] | None:
    """Split a comma-separated flag value, refusing empty items, repeats and (with
    ``known``) unknown values. ``None`` stays ``None``; ``""`` is ``[]`` with
    ``allow_empty`` and an error otherwise; repeats are allowed without ``unique``.

    Raises:
        InputError: naming the flag, the bad item and the valid values.
    """
    if text is None:
        return None
    if not text.strip():
        if allow_empty:
            return []
        raise InputError(
            f"{flag} is empty", where=flag, fix=f"give one or more {what}s, comma-separated"
        )
    items = [x.strip() for x in text.split(",")]
    if any(not x for x in items):
        raise InputError(
            f"{flag} {text!r} has an empty {what}",
            where=flag,
            fix=f"give comma-separated {what}s without empty entries, e.g. "
            + (",".join(known[:2]) if known else "a,b"),
        )
    seen: set[str] = set()
    repeats = [x for x in items if x in seen or seen.add(x)]  # type: ignore[func-returns-value]
    if repeats and unique:
        raise InputError(
            f"{flag} {text!r} names {what} {repeats[0]!r} more than once",
            where=flag,
            fix=f"name each {what} once",
        )
    if known is not None:
        unknown = [x for x in items if x not in known]
        if unknown:
            raise InputError(
                f"unknown {what}(s) {unknown} in {flag}",
                where=flag,
                fix=f"valid {what}s are {list(known)}",
            )
    return items


def parse_ints(
    text: str | None, flag: str, *, positive: bool = False, allow_empty: bool = False
) -> list[int] | None:
    """Comma-separated integers (repeats kept, in order); with ``positive`` each must be
    at least 1; ``""`` is ``[]`` with ``allow_empty``.

    Raises:
        InputError: ``--control-seeds takes comma-separated integers, got '0,x'``, ``--k needs
            positive integers, got '5,-1'``, or an empty item.
    """
    items = parse_list(text, flag, what="number", unique=False, allow_empty=allow_empty)
    if items is None:
        return None
    try:
        vals = [int(x) for x in items]
    except ValueError:
        raise InputError(
            f"{flag} takes comma-separated integers, got {text!r}", where=flag
        ) from None
    if positive and vals and min(vals) < 1:
        raise InputError(f"{flag} needs positive integers, got {text!r}", where=flag)
    if vals and max(abs(v) for v in vals) > MAX_LIST_INT:
        raise InputError(f"{flag} {text!r} holds a number beyond {MAX_LIST_INT:,}", where=flag,
                         fix="give realistic numbers")  # fmt: skip
    return vals


def count_or_all(text: str) -> int | None:
    """A count, or ``all`` for no cap (``None``): ``--limit`` (an argparse type)."""
    if text.strip().lower() == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a count nor 'all'") from None


def check_finite(values: Iterable[float], flag: str) -> None:
    """Refuse NaN and infinite numbers.

    Raises:
        InputError: naming the flag.
    """
    for v in values:
        if not math.isfinite(v):
            raise InputError(f"{flag} has {v!r}", where=flag, fix="give finite numbers")


def parse_floats(text: str | None, flag: str) -> list[float] | None:
    """Comma-separated finite numbers.

    Raises:
        InputError: ``--task-alphas takes comma-separated numbers, got 'big'``,
            ``--task-alphas has nan``, or an empty item.
    """
    items = parse_list(text, flag, what="number", unique=False)
    if items is None:
        return None
    try:
        vals = [float(x) for x in items]
    except ValueError:
        raise InputError(
            f"{flag} takes comma-separated numbers, got {text!r}", where=flag
        ) from None
    check_finite(vals, flag)
    return vals


def parse_int_range(text: str | None, flag: str) -> list[int] | None:
    """``'A-B'`` (inclusive) or comma-separated integers (``--mid-layers``).

    Raises:
        InputError: ``--mid-layers 'a-b': use 'A-B' or a comma-separated list``.
    """
    if text is None:
        return None
    bad = InputError(f"{flag} {text!r}: use 'A-B' or a comma-separated list", where=flag)
    if "-" in text:
        lo, _, hi = (x.strip() for x in text.partition("-"))
        if not (lo.isdigit() and hi.isdigit()):
            raise bad
        if int(hi) - int(lo) > MAX_RANGE:
            raise InputError(f"{flag} {text!r} spans more than {MAX_RANGE:,} values", where=flag,
                             fix="give a realistic range of layers")  # fmt: skip
        return list(range(int(lo), int(hi) + 1))
    try:
        return parse_ints(text, flag)
    except InputError:
        raise bad from None


def parse_config(text: str, flag: str = "--config") -> tuple[int, float, int, float]:
    """``task_layer,task_alpha,diff_layer,diff_alpha`` (``steer eval --config``): integer
    layers, finite alphas.

    Raises:
        InputError: not four numbers, a layer that is not an integer, or NaN/inf.
    """
    items = parse_list(text, flag, what="number", unique=False) or []
    fix = "give task_layer,task_alpha,diff_layer,diff_alpha, e.g. 4,0.1,12,0.1"
    if len(items) != 4:
        raise InputError(f"{flag} takes four numbers, got {text!r}", where=flag, fix=fix)
    bad = InputError(
        f"{flag} {text!r}: layers must be integers and alphas numbers", where=flag, fix=fix
    )
    try:
        vals = [float(x) for x in items]
    except ValueError:
        raise bad from None
    check_finite(vals, flag)
    if not (_is_int(items[0]) and _is_int(items[2])):
        raise bad
    return int(vals[0]), vals[1], int(vals[2]), vals[3]


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def check_int_limits(args: argparse.Namespace) -> None:
    """Refuse an integer flag beyond its bound in :data:`INT_LIMITS` (either sign), before
    anything it sizes is allocated.

    Raises:
        InputError: ``--texts-per-step 2,000,000,000 is more than 65,536 (texts in one
            optimizer step)``.
    """
    for name, (high, what) in INT_LIMITS.items():
        v = getattr(args, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > high:
            flag = "--" + name.replace("_", "-")
            raise InputError(f"{flag} {v:,} is more than {high:,} ({what})", where=flag,
                             fix=f"give at most {high:,}")  # fmt: skip

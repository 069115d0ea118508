"""Shared pieces of the command line: subcommand registration, the model/data/output
flags every command takes, loading the model and facts they select, and run metadata."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from mechlingo.cli.validate import check_after_load
from mechlingo.core import defaults
from mechlingo.core.distributed import dist_info
from mechlingo.core.errors import InputError, MechlingoError
from mechlingo.core.models import load_model, model_name, weight_mode
from mechlingo.core.tokens import CHAT_MODES, chat_enabled, use_chat
from mechlingo.core.types import Model
from mechlingo.core.version import __version__, library_versions
from mechlingo.data import (
    LANGS,
    RELATIONS,
    benchmark_format,
    load_benchmark,
    load_facts,
    read_facts,
)
from mechlingo.data.io import RETIRED_TEMPLATES
from mechlingo.scoring.scorers import Scorer

# Registered subcommands: name -> (add_args, run), filled by @command.
COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[Any], int]]] = {}


class UsageError(InputError):
    """Bad input on the command line; printed as one line, exit status 2."""


@contextlib.contextmanager
def usage_errors(*errors: type[Exception]) -> Iterator[None]:
    """Inside the block, ``errors`` (an analysis refusing its input) are raised again as a
    :class:`UsageError` with the same message."""
    try:
        yield
    except errors as err:
        raise UsageError(str(err)) from err


def command(
    name: str, help_text: str, add_args: Callable[[argparse.ArgumentParser], None]
) -> Callable:
    """Register a subcommand: the decorated function runs it, ``add_args`` adds its flags.
    Other modules (tracing, steering, experts) register theirs the same way."""

    def wrap(fn: Callable[[Any], int]) -> Callable[[Any], int]:
        fn.help_text = help_text  # type: ignore[attr-defined]
        COMMANDS[name] = (add_args, fn)
        return fn

    return wrap


def split_list(text: str | None) -> list[str] | None:
    """Comma-separated items (stripped, empty ones dropped); ``None`` when there are none.
    Flags are checked for empty items and repeats first (:func:`mechlingo.cli.flags.parse_list`)."""
    if text is None:
        return None
    items = [x.strip() for x in text.split(",") if x.strip()]
    return items or None


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--device``, ``--dtype``, ``--compat``."""
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default=None,
        help="model to load: omit for the embedded default (google/gemma-3-270m from PyPI), "
        "or a hub id, a local transformers folder, or a .gguf file",
    )
    g.add_argument(
        "--device", default=None, help="cuda or cpu (default: cuda when available, else cpu)"
    )
    g.add_argument("--dtype", default=None, help="model dtype, e.g. float32 or bfloat16 "
                   "(default float32; readouts are computed in float32 whatever the dtype)")  # fmt: skip
    g.add_argument("--chat", choices=CHAT_MODES, default="auto",
                   help="wrap prompts (facts, few-shot demonstrations, steering-vector build "
                   "prompts) in the tokenizer's chat template: on, off, or auto = on for a "
                   "chat-tuned model with a template (mechlingo.core.tokens)")  # fmt: skip
    g.add_argument(
        "--compat",
        action="store_true",
        help="fold layer norms (TransformerLens compatibility mode); recorded in artifacts",
    )


#: The bundled languages the fact commands read when neither ``--langs`` nor ``--facts``
#: says otherwise (a ``--facts`` file without ``--langs`` is read in all its languages).
DEFAULT_LANGS = "en,fr,de,es,ja"


def add_data_args(
    p: argparse.ArgumentParser,
    *,
    default_langs: str = DEFAULT_LANGS,
    langs_reason: str = "English and four others, one in another script: minutes on a CPU",
    default_templates: str = "measured",
    templates_reason: str = "",
    default_limit: int | None = 50,
    limit_reason: str = "",
    default_relation: str = "capital",
    relation_reason: str = "",
) -> None:
    """``--langs``, ``--relation``, ``--limit``, ``--facts``, ``--templates``; each help says
    its default as ``(default X: reason)`` when the reason is given (``langs_reason``,
    ``templates_reason``, ``limit_reason``, ``relation_reason``): a command whose default
    differs from the shared one must say why (``tests/cli/test_glossary.py`` checks it)."""
    g = p.add_argument_group("data")
    g.add_argument(
        "--templates",
        choices=["natural", "measured", "tuned"],
        default=None,
        help=f"prompt family of the bundled facts (default {default_templates}"
        + (f": {templates_reason}" if templates_reason else "")
        + "): natural = plain fact-completion stems never chosen on a model ('The capital of "
        "France is'); measured = the stems measured best zero-shot on the embedded model "
        "(docs/data.md; 'tuned' is its deprecated old name). --facts files keep their own "
        "prompts",
    )
    p.set_defaults(_templates_default=default_templates, _langs_default=default_langs)
    g.add_argument(
        "--langs",
        default=None,
        help=f"comma-separated language codes (default: {default_langs} of the bundled facts"
        + (f": {langs_reason}" if langs_reason else "")
        + "; every language of the --facts file); bundled data has en de fr es it pt ru zh "
        "ja ko ar hi",
    )
    relation_default = (
        "every bundled relation, the same number of facts from each"
        if default_relation == "all"
        else f"{default_relation} for the bundled data"
    ) + (f": {relation_reason}" if relation_reason else "")
    g.add_argument(
        "--relation",
        default=None,
        help=f"comma-separated relations, or 'all' (default: {relation_default}; every "
        "relation in the file with --facts)",
    )
    p.set_defaults(_relation_default=default_relation)
    g.add_argument(
        "--limit",
        type=int,
        default=default_limit,
        help="at most this many facts per relation, the same facts in every language (default "
        + ("every fact" if default_limit is None else str(default_limit))
        + (f": {limit_reason}" if limit_reason else "")
        + ")",
    )
    g.add_argument(
        "--facts",
        default=None,
        metavar="FILE|DIR",
        help="your own facts as .jsonl or .tsv (same schema as the bundled data; see "
        "docs/data.md), or a benchmark folder/file (BMLAMA, KLAR, mLAMA, mParaRel; the format "
        "is detected, see docs/benchmarks.md)",
    )


def add_parallel_arg(g: Any, help_text: str, **kw: Any) -> None:
    """``--parallel DIR``: a folder of parallel text (``None`` when omitted), with the
    command's ``help_text`` (and argparse's ``kw``, e.g. another ``dest``)."""
    g.add_argument("--parallel", default=None, metavar="DIR", help=help_text, **kw)


def add_metric_args(p: argparse.ArgumentParser) -> None:
    """``--metric`` (generate, klar, rank) and ``--rank-tokens``."""
    g = p.add_argument_group("scoring")
    g.add_argument(
        "--metric",
        choices=["generate", "klar", "rank"],
        default="generate",
        help="how facts are scored: generate (default: greedy continuation starts with the "
        "answer), klar (KLAR's 3-shot greedy rule, 10 tokens, two-way prefix match; CLC "
        "against English), rank (BMLAMA's candidate ranking by the filled sentence's mean "
        "cross-entropy; P@1 and RankC). See docs/methods/scoring.md",
    )
    g.add_argument(
        "--rank-tokens",
        choices=["sentence", "candidate"],
        default="sentence",
        help="with --metric rank: average the cross-entropy over the whole sentence (default, "
        "as the benchmark) or over the candidate's tokens only",
    )


#: the rank at or below which ``lens`` and ``trace`` count an answer as decodable
MAX_RANK = 10


def add_max_rank_arg(p: argparse.ArgumentParser, help_text: str) -> None:
    """``--max-rank`` (default :data:`MAX_RANK`), with the command's ``help_text``."""
    p.add_argument("--max-rank", type=int, default=MAX_RANK,
                   help=f"{help_text} (default {MAX_RANK})")  # fmt: skip


#: greedy tokens of fact scoring (:data:`mechlingo.core.defaults.MAX_NEW_TOKENS`)
MAX_NEW_TOKENS = defaults.MAX_NEW_TOKENS
#: why fact scoring generates 8 tokens (measured on the embedded tokenizer, the answers with a
#: leading space: 99.4% of the 12,960 bundled facts take at most 8 tokens)
MAX_NEW_TOKENS_REASON = "99% of the bundled answers take at most 8 tokens of the embedded model"


def add_max_new_tokens_arg(
    p: argparse.ArgumentParser, default: int = MAX_NEW_TOKENS, note: str = ""
) -> None:
    """``--max-new-tokens`` of the commands that score facts by greedy generation, with the
    command's default, its reason and ``note`` (what else decides the length) in its help."""
    extra = f"; {note}" if note else ""
    why = f": {MAX_NEW_TOKENS_REASON}".replace("%", "%%") if default == MAX_NEW_TOKENS else ""
    p.add_argument("--max-new-tokens", type=int, default=default,
                   help=f"greedy tokens to generate (default {default}{why}{extra})")  # fmt: skip


def scorer_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~mechlingo.scoring.scorers.Scorer` of ``--metric``/``--rank-tokens``."""
    return Scorer(getattr(args, "metric", "generate"), getattr(args, "rank_tokens", "sentence"))


#: The shared ``--batch-size`` default (:data:`mechlingo.core.defaults.BATCH_SIZE`); a
#: command with another one says why.
BATCH_SIZE = defaults.BATCH_SIZE


def add_batch_size_arg(
    p: argparse.ArgumentParser, default: int = BATCH_SIZE, reason: str = ""
) -> None:
    """``--batch-size`` (prompts per forward pass), with the command's default and, when it
    is not :data:`BATCH_SIZE`, the reason."""
    why = f": {reason}" if reason else ""
    p.add_argument(
        "--batch-size",
        type=int,
        default=default,
        help=f"prompts per forward pass (default {default}{why})",
    )


def add_out_arg(
    p: argparse.ArgumentParser, *, batch_size: int = BATCH_SIZE, batch_reason: str = ""
) -> None:
    """``--out``, ``--batch-size`` (default ``batch_size``, with ``batch_reason`` when it is
    not the shared default), ``--quiet``."""
    p.add_argument("--out", required=True, help="output folder (created; files in it replaced)")
    add_batch_size_arg(p, batch_size, batch_reason)
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def load_selected_facts(args: argparse.Namespace) -> list[Any]:
    """The facts selected by ``--facts/--langs/--relation/--limit`` (pass them to
    :func:`load_cli_model` for the context-length check). Without ``--langs`` the bundled
    facts are read in the command's default languages and a ``--facts`` file in all of its
    own."""

    rel = split_list(args.relation)
    if rel is None and args.facts is None:
        rel = split_list(getattr(args, "_relation_default", "capital"))
    if rel == ["all"]:
        rel = list(RELATIONS) if args.facts is None else None
    # with --facts and no --relation: every relation in the file
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    templates = getattr(args, "templates", None)
    if templates in RETIRED_TEMPLATES:
        print(f"warning: --templates {templates} is now --templates "
              f"{RETIRED_TEMPLATES[templates]}; the old name will be removed", file=sys.stderr)  # fmt: skip
        templates = RETIRED_TEMPLATES[templates]
    if templates == "natural" and args.facts is not None:
        raise UsageError(
            "--templates natural re-renders the bundled facts; a --facts file keeps its own "
            "prompts (drop --templates)"
        )
    if templates is None:
        templates = (
            getattr(args, "_templates_default", "measured") if args.facts is None else "measured"
        )
    args.templates_used = "file" if args.facts is not None else templates
    try:
        if args.facts is not None and benchmark_format(args.facts) is not None:
            facts = _load_benchmark_facts(args, rel)
        else:
            facts = load_facts(
                langs=selected_langs(args),
                relations=rel,
                limit=args.limit,
                path=args.facts,
                templates=templates,
            )
    except MechlingoError:
        raise
    except (ValueError, OSError) as err:
        raise UsageError(str(err)) from err
    return facts


def selected_langs(args: argparse.Namespace) -> list[str] | None:
    """The languages of ``--langs``; without it the command's default languages for the
    bundled facts, and every language of the file with ``--facts`` (``None`` for a
    benchmark: all of its languages)."""
    langs = split_list(args.langs)
    if langs is not None:
        return langs
    if getattr(args, "facts", None) is None:
        return split_list(getattr(args, "_langs_default", DEFAULT_LANGS))
    if benchmark_format(args.facts) is not None:
        return None  # a benchmark is read in all its languages
    present = {f.lang for f in read_facts(args.facts)}
    return [lg for lg in LANGS if lg in present] + sorted(present - set(LANGS))


def _load_benchmark_facts(args: argparse.Namespace, relations: list[str] | None) -> list[Any]:
    """Facts of a benchmark given with ``--facts``; the records skipped, by reason, are printed
    and kept on ``args`` for the summary's ``meta`` (:func:`run_meta`)."""
    bench = load_benchmark(
        args.facts, langs=selected_langs(args), relations=relations, limit=args.limit
    )
    if bench.texts is not None:
        raise UsageError(
            f"--facts {args.facts} is parallel text ({bench.format}), not facts; experts, "
            "align and tuned-lens read it with --parallel"
        )
    args.data_format = bench.format
    args.data_skipped = dict(sorted(bench.skipped.items()))
    if bench.skipped:
        counts = ", ".join(f"{k} {v}" for k, v in args.data_skipped.items())
        print(
            f"{args.facts}: skipped {sum(bench.skipped.values())} records ({counts})",
            file=sys.stderr,
        )
    return bench.facts


def load_cli_model(
    args: argparse.Namespace,
    *,
    facts: Sequence[Any] = (),
    texts: Mapping[str, Sequence[str]] | None = None,
) -> Model:
    """Load ``--model`` on ``--device``/``--dtype``, then run the checks that need it
    (:func:`mechlingo.cli.validate.check_after_load`: the command's ``facts`` or parallel
    ``texts`` against the context) before any computation."""

    device = args.device
    info = dist_info()
    if device is None and info.world_size > 1:
        device = str(info.device)  # under torchrun: this rank's GPU, or the CPU
    model = load_model(args.model, device=device, dtype=args.dtype, compat=args.compat)
    use_chat(model, getattr(args, "chat", "off"))
    check_after_load(model, args, facts=facts, texts=texts)
    return model


def run_meta(model: Model, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """The ``meta`` record of a command's summary: model, weights, device, the seeds
    (:func:`run_seeds`) and the library versions (mechlingo, Python, torch, transformers,
    transformer-lens, numpy, scipy), so that a number can be traced to what made it."""

    return {
        "model": model_name(model),
        "weights": weight_mode(model),
        "device": str(model.W_U.device),
        "mechlingo": __version__,
        "chat": chat_enabled(model),
        **({"templates": args.templates_used} if hasattr(args, "templates_used") else {}),
        **(
            {"data_format": args.data_format, "skipped": args.data_skipped}
            if hasattr(args, "data_skipped")
            else {}
        ),
        "seeds": run_seeds(args),
        "versions": library_versions(),
        **extra,
    }


def run_seeds(args: argparse.Namespace) -> dict[str, Any]:
    """Every seed a command drew with: its ``--seed``/``--control-seeds`` and the fixed seed 0 of
    the bootstrap intervals that no flag sets. Each arm, k, condition and role draws from a
    generator of its own, seeded from these (:func:`mechlingo.core.faults.derive_seed`), so
    adding or removing one leaves the others' numbers as they were."""
    seeds: dict[str, Any] = {}
    if isinstance(getattr(args, "seed", None), int):
        seeds["seed"] = args.seed
    if isinstance(getattr(args, "seeds", None), str):
        seeds["seeds"] = [int(x) for x in args.seeds.split(",") if x.strip()]
    seeds["bootstrap"] = seeds.get("seed", 0)
    return seeds

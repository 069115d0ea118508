"""Shared pieces of the command line: subcommand registration, the model/data/output
flags every command takes, loading the model and facts they select, and run metadata."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from mechlingo.cli.flags import count_or_all
from mechlingo.cli.glossary import about
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
from mechlingo.report.page import PLOTLYJS_FILE, PLOTLYJS_MODES
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
    """``--model``, ``--device``, ``--dtype``, ``--chat``, ``--compat``."""
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None, help=about("--model", "omit for the embedded "
                   "default (google/gemma-3-270m from PyPI)"))  # fmt: skip
    g.add_argument("--device", default=None, help=about("--device", "default: cuda when "
                   "available, else cpu"))  # fmt: skip
    g.add_argument("--dtype", default="float32", help=about("--dtype", "e.g. float32 or "
                   "bfloat16; readouts are computed in float32 whatever the dtype"))  # fmt: skip
    g.add_argument("--chat", choices=CHAT_MODES, default="auto", help=about("--chat", "auto = "
                   "on for a chat-tuned model with a template (mechlingo.core.tokens); it "
                   "wraps facts, few-shot demonstrations and steering-vector build prompts"))  # fmt: skip
    g.add_argument("--compat", action="store_true",
                   help=about("--compat", "recorded in artifacts"))  # fmt: skip


#: The languages every command reads from the bundled data when ``--langs`` is not given:
#: English and four others, one in another script (minutes on a CPU). A ``--facts`` file or
#: a ``--parallel`` folder is read in all its languages; ``--langs all`` reads every language
#: of the data.
DEFAULT_LANGS = "en,fr,de,es,ja"
#: ``--limit``: facts per relation when not given (``--limit all`` reads every fact)
DEFAULT_LIMIT = 50
#: ``--relation`` of the bundled facts when not given
DEFAULT_RELATION = "capital"
#: ``--templates`` when not given
DEFAULT_TEMPLATES = "measured"


def add_langs_arg(g: Any) -> None:
    """``--langs``, the same in every command (:data:`DEFAULT_LANGS`)."""
    g.add_argument(
        "--langs",
        default=None,
        help=about(
            "--langs",
            f"'all' = every language of the data (default: {DEFAULT_LANGS} of the bundled "
            "data: English and four others, one in another script; every language of a "
            "--facts file or --parallel folder); the bundled data has en de fr es it pt ru zh "
            "ja ko ar hi",
        ),
    )


def bundled_langs(text: str | None) -> list[str]:
    """The bundled languages ``--langs`` names (:data:`DEFAULT_LANGS` without it, every
    bundled language for ``all``)."""
    langs = split_list(text) or split_list(DEFAULT_LANGS) or []
    return list(LANGS) if langs == ["all"] else langs


def parallel_langs(args: argparse.Namespace, extra: Sequence[str] = ()) -> list[str] | None:
    """The languages of parallel text that ``--langs`` selects, with ``extra`` (the target
    languages, which are always read) added: ``None`` for every language of a ``--parallel``
    folder (no ``--langs``, or ``all``), :func:`bundled_langs` for the bundled sentences."""
    langs = split_list(args.langs)
    if getattr(args, "parallel", None):
        if langs is None or langs == ["all"]:
            return None
    else:
        langs = bundled_langs(args.langs)
    return langs + [lg for lg in extra if lg not in langs]


def add_data_args(p: argparse.ArgumentParser) -> None:
    """``--templates``, ``--langs``, ``--relation``, ``--limit``, ``--facts``: one default
    each, the same in every command that reads facts."""
    g = p.add_argument_group("data")
    g.add_argument("--templates", choices=["natural", "measured"], default=DEFAULT_TEMPLATES,
                   help=about("--templates", "natural = plain fact-completion stems never "
                   "chosen on a model ('The capital of France is', the papers' setting); "
                   "measured = the stems measured best zero-shot on the embedded model "
                   "(docs/data.md); --facts files keep their own prompts"))  # fmt: skip
    add_langs_arg(g)
    g.add_argument("--relation", default=None, help=about("--relation", f"default: "
                   f"{DEFAULT_RELATION} for the bundled data, every relation of a --facts "
                   "file"))  # fmt: skip
    g.add_argument("--limit", type=count_or_all, default=DEFAULT_LIMIT, metavar="N|all",
                   help=about("--limit", "'all' = every fact"))  # fmt: skip
    g.add_argument("--facts", default=None, metavar="FILE|DIR", help=about("--facts", "default: "
                   "the bundled facts; the same schema as the bundled data (docs/data.md); a benchmark's format "
                   "(BMLAMA, KLAR, mLAMA, mParaRel) is detected (docs/benchmarks.md)"))  # fmt: skip


def add_parallel_arg(g: Any, detail: str, **kw: Any) -> None:
    """``--parallel DIR``: a folder of parallel text (``None`` when omitted), with what the
    command reads it for (``detail``) and argparse's ``kw``, e.g. another ``dest``."""
    g.add_argument("--parallel", default=None, metavar="DIR", help=about("--parallel", detail),
                   **kw)  # fmt: skip


def add_metric_args(p: argparse.ArgumentParser) -> None:
    """``--metric`` (generate, klar, rank) and ``--rank-tokens``."""
    g = p.add_argument_group("scoring")
    g.add_argument("--metric", choices=["generate", "klar", "rank"], default="generate",
                   help=about("--metric", "generate = the greedy continuation starts with the "
                   "answer; klar = KLAR's 3-shot greedy rule, 10 tokens, two-way prefix match, "
                   "CLC against English; rank = BMLAMA's candidate ranking by the filled "
                   "sentence's mean cross-entropy, P@1 and RankC (docs/methods/scoring.md)"))  # fmt: skip
    g.add_argument("--rank-tokens", choices=["sentence", "candidate"], default="sentence",
                   help=about("--rank-tokens", "sentence as the benchmark"))  # fmt: skip


#: the rank at or below which ``lens`` and ``trace`` count an answer as decodable
MAX_RANK = 10


def add_max_rank_arg(p: argparse.ArgumentParser) -> None:
    """``--max-rank`` (default :data:`MAX_RANK`)."""
    p.add_argument("--max-rank", type=int, default=MAX_RANK,
                   help=about("--max-rank", "0 = top-1"))  # fmt: skip


#: greedy tokens of fact scoring (:data:`mechlingo.core.defaults.MAX_NEW_TOKENS`)
MAX_NEW_TOKENS = defaults.MAX_NEW_TOKENS
#: why fact scoring generates 8 tokens (measured on the embedded tokenizer, the answers with a
#: leading space: 99.4% of the 12,960 bundled facts take at most 8 tokens)
MAX_NEW_TOKENS_REASON = "99% of the bundled answers take at most 8 tokens of the embedded model"


def add_max_new_tokens_arg(p: argparse.ArgumentParser, note: str = "") -> None:
    """``--max-new-tokens``: the greedy answer tokens of the commands that score facts by
    generation (default :data:`MAX_NEW_TOKENS`), with ``note`` (what else decides the length)."""
    extra = f"; {note}" if note else ""
    why = MAX_NEW_TOKENS_REASON.replace("%", "%%")
    p.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS,
                   help=about("--max-new-tokens", f"{why}{extra}"))  # fmt: skip


def scorer_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~mechlingo.scoring.scorers.Scorer` of ``--metric``/``--rank-tokens``."""
    return Scorer(getattr(args, "metric", "generate"), getattr(args, "rank_tokens", "sentence"))


#: The ``--batch-size`` default of every command (:data:`mechlingo.core.defaults.BATCH_SIZE`).
BATCH_SIZE = defaults.BATCH_SIZE


def add_batch_size_arg(p: argparse.ArgumentParser) -> None:
    """``--batch-size`` (prompts or texts per forward pass, default :data:`BATCH_SIZE`)."""
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE, help=about("--batch-size"))


def add_out_arg(p: argparse.ArgumentParser, *, report: bool = True) -> None:
    """``--out``, ``--batch-size``, ``--quiet`` and, for a command that writes
    ``report.html`` (``report``), ``--plotlyjs``."""
    p.add_argument("--out", required=True, help=about("--out", "created; files in it replaced"))
    add_batch_size_arg(p)
    p.add_argument("--quiet", action="store_true", help=about("--quiet"))
    if report:
        add_plotlyjs_arg(p)


def add_plotlyjs_arg(p: argparse.ArgumentParser) -> None:
    """``--plotlyjs inline|file``: how ``report.html`` loads plotly.js."""
    p.add_argument("--plotlyjs", choices=PLOTLYJS_MODES, default=None,
                   help=about("--plotlyjs", f"inline = one self-contained file (about 5 MB); "
                   f"file = every report of --out loads one {PLOTLYJS_FILE} beside it "
                   "(default: inline, or MECHLINGO_PLOTLYJS from the environment)"))  # fmt: skip


def load_selected_facts(args: argparse.Namespace) -> list[Any]:
    """The facts selected by ``--facts/--langs/--relation/--limit`` (pass them to
    :func:`load_cli_model` for the context-length check). Without ``--langs`` the bundled
    facts are read in the command's default languages and a ``--facts`` file in all of its
    own."""

    rel = split_list(args.relation)
    if rel is None and args.facts is None:
        rel = [DEFAULT_RELATION]
    if rel == ["all"]:
        rel = list(RELATIONS) if args.facts is None else None
    # with --facts and no --relation: every relation in the file
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    templates = getattr(args, "templates", None) or DEFAULT_TEMPLATES
    if templates == "natural" and args.facts is not None:
        raise UsageError(
            "--templates natural re-renders the bundled facts; a --facts file keeps its own "
            "prompts (drop --templates)"
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
    if getattr(args, "facts", None) is None:
        return bundled_langs(args.langs)
    if langs is not None and langs != ["all"]:
        return langs
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

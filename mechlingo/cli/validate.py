"""Checks of user input, run before any model loads (and, for what needs the model's
tokenizer and sizes, right after it loads and before any computation).

Each check raises a :class:`~mechlingo.core.errors.MechlingoError` subclass whose message says
what is wrong, where (the flag, or the file and line) and what to do. The ``mechlingo``
command runs :func:`validate_args` on every parsed command line and
:func:`check_after_load` on every loaded model; the functions are public so that library
code and notebooks can reuse them.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechlingo.cli.flags import (
    check_finite,
    check_int_limits,
    parse_config,
    parse_floats,
    parse_ints,
    parse_list,
)
from mechlingo.cli.paths import check_paths, check_repeats
from mechlingo.cli.places import check_device, check_dtype, check_model_source, check_out
from mechlingo.core.checks import check_gguf_file, check_model_folder
from mechlingo.core.defaults import check_seeds
from mechlingo.core.describe import missing_fields
from mechlingo.core.errors import (
    ArtifactError,
    ContextLengthError,
    DataError,
    InputError,
    MissingArtifactError,
    ModelLoadError,
)
from mechlingo.core.languages import is_lang_code, lang_code
from mechlingo.core.models import default_model_dir
from mechlingo.core.sites import canonical_site
from mechlingo.core.types import Model
from mechlingo.core.untrusted import read_json, refuse_special
from mechlingo.data import LANGS, RELATIONS, benchmark_format, few_shot_prompt, read_facts
from mechlingo.interventions import load_intervention
from mechlingo.scoring.scorers import KLAR_MAX_NEW_TOKENS, klar_prompt

__all__ = [
    "ModelShape",
    "check_after_load",
    "check_context",
    "check_data_file",
    "check_device",
    "check_dtype",
    "check_finite",
    "check_gguf_file",
    "check_layers",
    "check_model_folder",
    "check_out",
    "parse_list",
    "validate_args",
]


#: Integer flags that must be at least 1 when given (``args`` attribute names).
POSITIVE_INTS = (
    "batch_size",
    "max_new_tokens",
    "limit",
    "k_shot",
    "max_rank",
    "cells_per_batch",
    "dev_per_lang",
    "test_per_lang",
    "top_k",
    "max_tokens",
    "samples",
    "sample_tokens",
    "heldout",
    "repeats",
    "lines",
    "side_effects_lines",
    "ig_steps",
    "circuit_prompts",
)
#: Integer flags that must be at least 0 when given.
NON_NEGATIVE_INTS = ("offset", "patch_prompts", "translation_shots", "verify_edges",
                     "patchscope_tokens")  # fmt: skip

_FACT_COMMANDS = ("lens", "eval", "trace", "steer", "circuit")
_TEXT_COMMANDS = ("experts", "align")  # tuned-lens checks its own --parallel


def _flag(name: str) -> str:
    """The flag of an ``args`` attribute: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


# --------------------------------------------------------------------------------------
# Data files
# --------------------------------------------------------------------------------------


def check_data_file(text: str | None, flag: str = "--facts") -> list[Any] | None:
    """Read a facts file (``.jsonl``/``.tsv``) given with ``--facts`` and return its facts.

    Raises:
        DataError: missing, a folder, unknown extension, not UTF-8 (file and line), empty or
            header-only, or a malformed record (file, line and field).
    """
    if text is None:
        return None

    path = Path(text).expanduser()
    if not text.strip():
        raise DataError(f"{flag} is empty", where=flag, fix="name a .jsonl or .tsv facts file")
    if not path.exists():
        raise DataError(f"{flag} {text} does not exist", where=flag)
    if path.is_dir():
        raise DataError(
            f"{flag} {text} is a folder, not a facts file",
            where=flag,
            fix="pass a .jsonl or .tsv file (see docs/data.md)",
        )
    try:
        return read_facts(path)
    except PermissionError:
        raise DataError(f"{flag} {text} is not readable", where=flag) from None


def check_text_dir(text: str | None, langs: list[str] | None, flag: str = "--parallel") -> None:
    """Check a folder of ``<lang>.txt`` files given with ``--parallel`` (experts, align,
    tuned-lens, steer eval)."""
    if text is None:
        return
    path = Path(text).expanduser()
    if not text.strip():
        raise DataError(f"{flag} is empty", where=flag)
    if not path.exists():
        raise DataError(f"{flag} {text} does not exist", where=flag)
    if not path.is_dir():
        raise DataError(
            f"{flag} {text} is a file; {flag} takes a folder of <lang>.txt files",
            where=flag,
            fix="pass the folder (e.g. an NTREX export)",
        )


# --------------------------------------------------------------------------------------
# Model sizes: from config.json before loading, from the model after
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The sizes flags are checked against: layers, MLP width, context length (``None``
    where unknown)."""

    n_layers: int
    d_mlp: int | None = None
    n_ctx: int | None = None

    @classmethod
    def from_model(cls, model: Model) -> ModelShape:
        """Sizes of a loaded TransformerLens model."""
        cfg = model.cfg
        n_ctx = getattr(cfg, "n_ctx", None)
        return cls(int(cfg.n_layers), int(getattr(cfg, "d_mlp", 0) or 0) or None, n_ctx)

    @classmethod
    def from_config(cls, model_arg: str | None) -> ModelShape | None:
        """Sizes from the config.json of a local folder (or of the cached default model)
        without loading weights; ``None`` when there is no such file."""
        if model_arg is None:
            folder = default_model_dir()
        else:
            folder = Path(model_arg).expanduser()
        try:
            cfg = read_json(folder / "config.json", ModelLoadError, numbers=False)
        except ModelLoadError:
            return None
        if not isinstance(cfg, dict):
            return None
        cfg = cfg.get("text_config", cfg) | {
            k: v for k, v in cfg.items() if k not in cfg.get("text_config", {})
        }
        n_layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers")
        if not isinstance(n_layers, int):
            return None
        d_mlp = cfg.get("intermediate_size") or cfg.get("n_inner")
        return cls(n_layers, d_mlp if isinstance(d_mlp, int) else None, None)


def check_layers(layers: Iterable[int], n_layers: int, flag: str) -> None:
    """Refuse layers outside ``-n_layers .. n_layers - 1``.

    Raises:
        InputError: naming the flag and the valid range.
    """
    for layer in layers:
        if not -n_layers <= layer < n_layers:
            raise InputError(
                f"{flag} {layer} is out of range for a model with {n_layers} layers",
                where=flag,
                fix=f"use 0 .. {n_layers - 1} (negative counts from the end)",
            )


def _check_shape(args: argparse.Namespace, shape: ModelShape) -> None:
    cmd = getattr(args, "command", None)
    n = shape.n_layers
    if cmd == "align" and getattr(args, "layer", None) is not None:
        check_layers([args.layer], n, "--layer")
    if cmd == "experts":
        layers = parse_ints(getattr(args, "layers", None), "--layers")
        if layers:
            check_layers(layers, n, "--layers")
        ks = parse_ints(getattr(args, "k", None), "--k") or []
        if shape.d_mlp and ks:
            searched = len({x % n for x in layers}) if layers else n
            total = searched * shape.d_mlp
            if max(ks) > total:
                raise InputError(
                    f"--k {max(ks)} is more than the {total} MLP neurons searched "
                    f"({searched} layers x {shape.d_mlp})",
                    where="--k",
                    fix=f"use k <= {total}",
                )
    for name in ("task_layers", "diff_layers"):
        vals = parse_ints(getattr(args, name, None), _flag(name))
        if vals:
            check_layers(vals, n, _flag(name))
    config = getattr(args, "config", None)
    if isinstance(config, str) and getattr(args, "steer_command", None) == "eval":
        task_layer, _, diff_layer, _ = parse_config(config)
        check_layers([task_layer, diff_layer], n, "--config")


# --------------------------------------------------------------------------------------
# Context length
# --------------------------------------------------------------------------------------


def check_context(
    model: Model,
    prompts: Sequence[tuple[str, str]],
    *,
    new_tokens: int = 0,
    flag: str | None = None,
) -> None:
    """Refuse a prompt whose tokens plus ``new_tokens`` (plus a BOS) exceed the model's
    context ``n_ctx``, naming the offending prompt (``(label, text)`` pairs).

    Raises:
        ContextLengthError: the label, the token count and the limit.
    """
    n_ctx = getattr(model.cfg, "n_ctx", None)
    tok = getattr(model, "tokenizer", None)
    if not n_ctx or tok is None or not prompts:
        return
    limit = int(n_ctx)
    # Cheap pre-filter: a token covers at least one character for byte-level tokenizers,
    # but some tokenizers merge many characters; tokenize every prompt in one batch.
    texts = [t for _, t in prompts]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    worst = max(range(len(texts)), key=lambda i: len(ids[i]))
    need = len(ids[worst]) + 1 + max(0, new_tokens)
    if need > limit:
        label = prompts[worst][0]
        extra = f" + {new_tokens} new tokens" if new_tokens else ""
        raise ContextLengthError(
            f"{label} is {len(ids[worst])} tokens + BOS{extra} = {need}, more than the "
            f"model's context of {limit} positions",
            where=flag,
            fix="shorten or drop that prompt"
            + (", or lower " + flag if flag else "")
            + " (or use a model with a longer context)",
        )


def _fact_label(fact: Any, data: str | None) -> str:
    where = f" in {data}" if data else ""
    return f"fact {fact.id!r} ({fact.lang}, {fact.relation}){where}"


def check_after_load(
    model: Model,
    args: argparse.Namespace,
    *,
    facts: Sequence[Any] = (),
    texts: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """The checks that need the loaded model, run before any computation: layer and
    neuron counts, and the length of every prompt of ``facts`` and sentence of ``texts``
    (the command's data) against the context (``n_ctx``), naming the one that does not fit.

    Raises:
        InputError / ContextLengthError: see :func:`validate_args`.
    """
    _check_shape(args, ModelShape.from_model(model))
    prompts = getattr(args, "prompt", None)  # lens --prompt: read at every position
    if isinstance(prompts, list) and prompts:
        labelled = [(f"--prompt {i + 1}", p) for i, p in enumerate(prompts)]
        check_context(model, labelled, flag="--prompt")
    if facts:
        name = "max_new_tokens" if hasattr(args, "max_new_tokens") else "patchscope_tokens"
        new = int(getattr(args, name, 0) or 0)
        labelled = [(_fact_label(f, args.facts), f.prompt) for f in facts]
        check_context(model, labelled, new_tokens=new, flag=_flag(name) if new else None)
        k_shot = getattr(args, "k_shot", None)
        if k_shot:
            longest = sorted(facts, key=lambda f: len(f.prompt), reverse=True)[:5]
            shots = []
            for f in longest:
                try:
                    text = few_shot_prompt(f, facts, k_shot)
                except ValueError:  # too few demonstrations: reported by the command itself
                    continue
                shots.append((_fact_label(f, args.facts) + f" as a {k_shot}-shot prompt", text))
            check_context(model, shots, flag="--k-shot")
        _check_metric_context(model, args, facts)
    if texts:
        max_tokens = getattr(args, "max_tokens", None)
        n_ctx = getattr(model.cfg, "n_ctx", None)
        if max_tokens and n_ctx and max_tokens + 1 > n_ctx:
            raise ContextLengthError(
                f"--max-tokens {max_tokens} + BOS is more than the model's context of {n_ctx}",
                where="--max-tokens",
                fix=f"use --max-tokens {int(n_ctx) - 1} or less",
            )
        if not max_tokens:
            src = getattr(args, "parallel", None) or "the bundled sentences"
            labelled = [
                (f"{lg} sentence {i + 1} of {src}", s)
                for lg, sents in texts.items()
                for i, s in enumerate(sents)
            ]
            check_context(model, labelled, flag="--max-tokens")


def _check_metric_context(model: Model, args: argparse.Namespace, facts: Sequence[Any]) -> None:
    """What ``--metric klar`` (its 3-shot prompts and 10 new tokens) and ``--metric rank``
    (the filled sentences, suffix included) give the model must fit its context too."""
    metric = getattr(args, "metric", "generate")
    if metric == "klar":
        longest = sorted(facts, key=lambda f: len(f.prompt), reverse=True)[:5]
        labelled = [
            (_fact_label(f, args.facts) + " as a KLAR prompt", klar_prompt(f, facts))
            for f in longest
        ]
        check_context(model, labelled, new_tokens=KLAR_MAX_NEW_TOKENS, flag="--metric")
    elif metric == "rank":
        filled = [
            (_fact_label(f, args.facts) + f" filled with {c!r}", f.filled(c))
            for f in facts
            for c in f.candidates
        ]
        check_context(model, filled, flag="--metric")


# --------------------------------------------------------------------------------------
# Everything a command line can get wrong, before the model loads
# --------------------------------------------------------------------------------------


def _check_artifact_dir(path_text: str | None, flag: str, *, pair: bool = False) -> None:
    """A saved intervention folder (or, with ``pair``, a ``steer build`` folder) must load
    (without a model: files present, JSON and safetensors intact)."""
    if path_text is None:
        return
    path = Path(path_text).expanduser()
    if not path.is_dir():
        raise MissingArtifactError(
            f"{flag} {path_text} is not a folder"
            + (" (it does not exist)" if not path.exists() else ""),
            where=flag,
            fix="pass a folder written by `mechlingo steer build`"
            if pair
            else "pass a clamp folder written by `mechlingo experts` (e.g. EDIR/es-k2000)",
        )

    for sub in ("task", "diff") if pair else ("",):
        folder = path / sub if sub else path
        iv = load_intervention(folder)
        if not iv.meta.get("model"):
            raise ArtifactError(
                f"the intervention in {folder} records no model (meta.model), so mechlingo "
                "cannot check that it fits --model",
                where=flag,
                fix="re-save it with intervention.save(path, model)",
            )
        missing = (
            missing_fields(iv.meta["model"]) if isinstance(iv.meta["model"], dict) else ["all"]
        )
        if missing:
            raise ArtifactError(
                f"the intervention in {folder} records its model without {', '.join(missing)}, "
                "so mechlingo cannot check that it fits --model",
                where=flag,
                fix="re-save it with intervention.save(path, model) on the model it was built on",
            )
    if pair:
        build = path / "build.json"
        doc: Any = {}
        refuse_special(build, ArtifactError)
        if build.is_file():
            doc = read_json(build, ArtifactError, root=path)
        if not isinstance(doc, dict) or "unit" not in doc:
            raise ArtifactError(
                f"{flag} {path_text} records no unit for its vectors (what alpha is measured "
                "in): it was written before units existed or its build.json is missing",
                where=flag,
                fix=f"rebuild it with `mechlingo steer build --out {path_text}`",
            )


def _check_counts(args: argparse.Namespace) -> None:
    """Integer flags: ``POSITIVE_INTS`` at least 1, ``NON_NEGATIVE_INTS`` at least 0
    (``lens --patchscope-tokens 0``: the patchscope reads its first token only)."""
    for names, low in ((POSITIVE_INTS, 1), (NON_NEGATIVE_INTS, 0)):
        for name in names:
            v = getattr(args, name, None)
            least = low
            if isinstance(v, int) and not isinstance(v, bool) and v < least:
                need, fix = (
                    ("at least 1", "give a positive number")
                    if least == 1
                    else ("0 or more", "give 0 or a positive number")
                )
                raise InputError(
                    f"{_flag(name)} must be {need}, got {v}", where=_flag(name), fix=fix
                )


#: ``args`` attributes that hold comma-separated language codes (``"all"`` allowed in some)
LANG_FLAGS = ("langs", "track", "target")


def canonical_lang_flags(args: argparse.Namespace) -> None:
    """Check the language flags (:data:`LANG_FLAGS`) and rewrite them in canonical codes, so
    that ``--langs sv,swh_Latn`` reads the records of ``sv`` and ``sw``: any ISO 639 / BCP 47
    or FLORES code (:func:`~mechlingo.core.languages.lang_code`).

    Raises:
        InputError: a code that names no language, or one language named twice.
    """
    for name in LANG_FLAGS:
        flag = _flag(name)
        items = parse_list(getattr(args, name, None), flag, what="language",
                           allow_empty=name == "track")  # fmt: skip
        if items is None:
            continue
        unknown = [x for x in items if x != "all" and not is_lang_code(x)]
        if unknown:
            raise InputError(
                f"unknown language(s) {unknown} in {flag}: not ISO 639 / BCP 47 codes",
                where=flag,
                fix="use codes such as sv, sw, zh-Hant or sr-Latn (FLORES swh_Latn works too); "
                f"the bundled data has {','.join(LANGS)}",
            )
        canon = [x if x == "all" else lang_code(x) for x in items]
        twice = sorted({c for c in canon if canon.count(c) > 1})
        if twice:
            raise InputError(f"{flag} names {twice[0]} more than once (in different codes)",
                             where=flag, fix="name each language once")  # fmt: skip
        setattr(args, name, ",".join(canon))


def _check_bundled_langs(langs: list[str] | None, data_flag: str, what: str) -> None:
    """Without ``data_flag`` the bundled data is read: a language outside it is refused
    with what to pass instead."""
    outside = [lg for lg in langs or [] if lg not in LANGS and lg != "all"]
    if outside:
        raise InputError(
            f"--langs {','.join(outside)}: the bundled {what} are in {','.join(LANGS)} only",
            where="--langs",
            fix=f"for another language pass your own with {data_flag} "
            "(docs/data.md: languages outside the bundled twelve)",
        )


def _check_fact_flags(args: argparse.Namespace) -> None:
    """Flags of the commands that read facts (lens, eval, trace, steer)."""
    langs = parse_list(getattr(args, "langs", None), "--langs", what="language")
    data = getattr(args, "facts", None)
    if data is None and not getattr(args, "prompt", None):
        _check_bundled_langs(langs, "--facts FILE", "facts")
    bench = data is not None and data.strip() != "" and benchmark_format(data) is not None
    facts = None if bench else check_data_file(data)  # a benchmark is read with the facts
    rel = getattr(args, "relation", None)
    if rel is not None and rel.strip() != "all" and not bench:
        available = RELATIONS if facts is None else sorted({f.relation for f in facts})
        parse_list(rel, "--relation", known=available, what="relation")
    if hasattr(args, "patch_sites"):
        for site in parse_list(args.patch_sites, "--patch-sites", what="site") or []:
            canonical_site(site)
    for name in ("task_alphas", "diff_alphas"):
        if hasattr(args, name):
            parse_floats(getattr(args, name), _flag(name))
    for name in ("task_layers", "diff_layers"):
        if hasattr(args, name):
            parse_ints(getattr(args, name), _flag(name))
    if getattr(args, "steer_command", "") == "eval":
        if getattr(args, "config", None) is not None:
            parse_config(args.config)
        check_seeds(parse_ints(args.seeds, "--control-seeds", allow_empty=True) or [],
                    what="--control-seeds")  # fmt: skip
        _check_side_effect_flags(args)
    if hasattr(args, "vectors"):
        _check_artifact_dir(args.vectors, "--vectors", pair=True)


def _check_side_effect_flags(args: argparse.Namespace) -> None:
    """``steer eval``: ``--side-effects`` measures on the lines of ``--parallel DIR``; one
    without the other is refused."""
    switch, folder = getattr(args, "side_effects_on", False), getattr(args, "side_effects", None)
    if switch and not folder:
        raise InputError(
            "steer eval --side-effects measures on parallel lines but no --parallel DIR is given",
            where="--side-effects",
            fix="add --parallel DIR (a folder of line-aligned <lang>.txt files, e.g. NTREX)",
        )
    if folder and not switch:
        raise InputError(
            "steer eval reads --parallel only for --side-effects",
            where="--parallel",
            fix="add --side-effects, or drop --parallel",
        )
    if folder:
        check_text_dir(folder, None, "--parallel")


def _check_experts_flags(
    args: argparse.Namespace, langs: list[str] | None, known: Sequence[str] | None
) -> None:
    parse_list(args.target, "--target", known=known, what="language")  # read besides --langs
    parse_ints(args.layers, "--layers")
    parse_ints(args.k, "--k", positive=True)


def _check_align_flags(
    args: argparse.Namespace, langs: list[str] | None, known: Sequence[str] | None
) -> None:
    if args.target is not None:
        parse_list(args.target, "--target", known=known, what="language")  # read besides --langs
    clamp = Path(args.clamp).expanduser() if args.clamp else None
    if not (  # an `experts` output folder: align picks the clamp of the chosen k
        clamp is not None
        and (clamp / "summary.json").is_file()
        and not (clamp / "intervention.json").exists()
    ):
        _check_artifact_dir(args.clamp, "--clamp")
    _check_artifact_dir(args.control, "--control")


def _check_text_flags(args: argparse.Namespace) -> None:
    """Flags of the commands that read parallel sentences (experts, align)."""
    known = None if getattr(args, "parallel", None) else LANGS  # the bundled facts' own
    langs = parse_list(getattr(args, "langs", None), "--langs", what="language")
    if known is not None:
        _check_bundled_langs(langs, "--parallel DIR", "sentences")
    check_text_dir(getattr(args, "parallel", None), langs, "--parallel")
    if args.command == "experts":
        _check_experts_flags(args, langs, known)
    if args.command == "align":
        _check_align_flags(args, langs, known)


#: the largest integer flag value (counts, layers, sizes): a signed 32-bit integer
MAX_FLAG_INT = 2**31 - 1
#: float flags and the range each must lie in (``(low, high, low_open)``), besides finite
FLOAT_RANGES: dict[str, tuple[float, float, bool]] = {
    "lr": (0.0, 10.0, True),
    "max_seconds": (0.0, math.inf, True),
    "ppl_budget": (0.0, math.inf, False),
    "en_tolerance": (0.0, 1.0, False),
    "p_threshold": (0.0, 1.0, True),
    "faithfulness": (0.0, 1.0, True),
}


def _check_numbers(args: argparse.Namespace) -> None:
    """Every numeric flag: finite, an integer within ``±MAX_FLAG_INT`` (a seed within
    64 bits), a float of :data:`FLOAT_RANGES` within its range."""
    for name, v in sorted(vars(args).items()):
        if name.startswith("_") or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        flag = _flag(name)
        if isinstance(v, float):
            check_finite([v], flag)
            low, high, low_open = FLOAT_RANGES.get(name, (-math.inf, math.inf, False))
            if v < low or v > high or (low_open and v == low):
                bound = f"above {low:g}" if low_open else f"at least {low:g}"
                top = "" if math.isinf(high) else f" and at most {high:g}"
                raise InputError(f"{flag} must be {bound}{top}, got {v!r}", where=flag,
                                 fix=f"give a number {bound}{top}")  # fmt: skip
        elif name == "seed" and not -(2**63) <= v < 2**63:
            raise InputError(f"--seed {v} is not a 64-bit integer", where=flag,
                             fix="give a smaller seed")  # fmt: skip
        elif name == "seed":
            continue
        elif abs(v) > MAX_FLAG_INT:
            raise InputError(f"{flag} {v} is out of range (at most {MAX_FLAG_INT:,})",
                             where=flag, fix="give a realistic number")  # fmt: skip


def validate_args(args: argparse.Namespace) -> None:
    """Check every flag of a parsed ``mechlingo`` command line before any model loads.

    Raises:
        MechlingoError: the first problem found (see the module docstring).
    """

    cmd = getattr(args, "command", None)
    check_paths(args)
    check_repeats(args)
    _check_numbers(args)
    check_int_limits(args)
    _check_counts(args)
    check_device(getattr(args, "device", None))
    check_dtype(getattr(args, "dtype", None))
    check_model_source(getattr(args, "model", None))
    canonical_lang_flags(args)
    artifact = cmd == "experts" or getattr(args, "steer_command", None) == "build"
    if hasattr(args, "out"):
        check_out(args.out, artifact=artifact)
    if cmd in _FACT_COMMANDS:
        _check_fact_flags(args)
    if cmd in _TEXT_COMMANDS:
        _check_text_flags(args)
    shape = ModelShape.from_config(getattr(args, "model", None))
    if shape is not None:
        _check_shape(args, shape)

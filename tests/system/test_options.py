"""One default per option: every public signature and options dataclass of mechlingo, and
every command's flags, agree on the shared option names (or differ by a stated reason);
the options objects refuse bad values with one line saying what to pass."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import pkgutil
import textwrap
from typing import Any

import pytest
import torch

import mechlingo
from mechlingo.analyses.decoders.lens import LensRunOptions
from mechlingo.analyses.decoders.options import TrainingOptions
from mechlingo.analyses.decoders.patchscope import PATCHSCOPE_BATCH_SIZE
from mechlingo.analyses.decoders.tuned_lens import HELDOUT_BATCH_SIZE
from mechlingo.analyses.experts.align_run import AlignOptions
from mechlingo.analyses.experts.kcurve import KCurveOptions
from mechlingo.analyses.experts.run import ExpertSettings
from mechlingo.analyses.recall.settings import BuildSettings, ScoringOptions
from mechlingo.analyses.recall.trace import run_trace
from mechlingo.analyses.recall.trace_options import TraceOptions
from mechlingo.card.replicate import CardData, CardOptions
from mechlingo.cli import build_parser
from mechlingo.core import defaults as D
from mechlingo.core.errors import InputError, MechlingoError
from mechlingo.scoring.evaluate import DecodeOptions
from mechlingo.scoring.side_effects import SideEffectOptions

#: the shared option names and the one default each takes
SHARED: dict[str, Any] = {
    "batch_size": D.BATCH_SIZE,
    "max_new_tokens": D.MAX_NEW_TOKENS,
    "cache": D.KV_CACHE,
    "kv_cache": D.KV_CACHE,
    "early_stop": D.EARLY_STOP,
    "seed": D.SEED,
    "progress": D.PROGRESS,
}
#: shared names without a constant: every default of the name must be the same one
SAME: tuple[str, ...] = ("limit", "seeds", "langs")

#: Deliberate differences, each with the constant it must equal and why (a stale entry, a
#: location that no longer exists or a value that drifted, fails too).
ALLOWED: dict[str, Any] = {
    # the steering protocol scores short prompts under many conditions: `steer eval --help`
    "analyses.recall.settings.ScoringOptions:batch_size": D.STEER_BATCH_SIZE,
    "analyses.recall.settings.ScoringOptions:max_new_tokens": D.STEER_MAX_NEW_TOKENS,
    "analyses.recall.steering.score_facts:batch_size": D.STEER_BATCH_SIZE,
    "analyses.recall.steering.score_facts:max_new_tokens": D.STEER_MAX_NEW_TOKENS,
    "analyses.recall.steering.score_at_config:batch_size": D.STEER_BATCH_SIZE,
    "analyses.recall.steering.score_at_config:max_new_tokens": D.STEER_MAX_NEW_TOKENS,
    "analyses.recall.steer_eval.SteerEvalResult.add_side_effects:batch_size": D.STEER_BATCH_SIZE,
    # the card's metric rule scores the repair dev split as the steering protocol does
    "card.metric_rule.dev_accuracies:max_new_tokens": D.STEER_MAX_NEW_TOKENS,
    # held-out texts are whole lines, longer than fact prompts: `tuned-lens --help`
    "analyses.decoders.run.run_tuned_lens:batch_size": HELDOUT_BATCH_SIZE,
    "analyses.decoders.tuned_lens.lens_divergence:batch_size": HELDOUT_BATCH_SIZE,
    # samples from BOS are free text whose language is identified: `experts --help`
    "activations.likelihood.sample_from_bos:max_new_tokens": D.SAMPLE_NEW_TOKENS,
    "analyses.experts.kcurve.KCurveOptions:max_new_tokens": D.SAMPLE_NEW_TOKENS,
    "analyses.experts.stacked.stacked_bos_samples:max_new_tokens": D.SAMPLE_NEW_TOKENS,
    "analyses.experts.run.ExpertSettings:max_new_tokens": D.SAMPLE_NEW_TOKENS,
    # the patchscope's rows are one short target prompt per layer; its continuation is off
    # unless `lens --patchscope-tokens` asks for it (`lens --help`)
    "analyses.decoders.patchscope.Patchscope:batch_size": PATCHSCOPE_BATCH_SIZE,
    "analyses.decoders.patchscope.Patchscope:max_new_tokens": 0,
    "analyses.decoders.patchscope.Patchscope.generate:max_new_tokens": None,
    # a budget's unset seed means the matrix settings' own
    "card.stages.transfer.MatrixBudget:seed": None,
    # a card's unset batch size means each analysis's own default (CardSettings.batch)
    "card.stages.CardSettings:batch_size": None,
}


def _public() -> dict[str, Any]:
    """``{"module.qualname": object}`` of mechlingo's public API outside the CLI: each
    module's ``__all__`` (else its public names defined there), classes with their public
    methods."""
    out: dict[str, Any] = {}
    infos = [m.name for m in pkgutil.walk_packages(mechlingo.__path__, "mechlingo.")]
    for name in ["mechlingo", *infos]:
        if ".cli" in name or name.endswith("__main__"):
            continue
        mod = importlib.import_module(name)
        names = getattr(mod, "__all__", None) or [
            n for n, o in vars(mod).items()
            if not n.startswith("_") and getattr(o, "__module__", None) == name
        ]  # fmt: skip
        for n in names:
            obj = getattr(mod, n, None)
            if not (callable(obj) and getattr(obj, "__module__", "").startswith("mechlingo")):
                continue
            where = f"{obj.__module__.removeprefix('mechlingo.')}.{obj.__qualname__}"
            out[where] = obj
            for m, f in vars(obj).items() if inspect.isclass(obj) else ():
                f = getattr(f, "__func__", f)
                if not m.startswith("_") and inspect.isfunction(f):
                    out[f"{where}.{m}"] = f
    return out


def _defaults() -> dict[str, dict[str, Any]]:
    """``{option name: {location: default}}`` for the shared names."""
    names = set(SHARED) | set(SAME)
    found: dict[str, dict[str, Any]] = {n: {} for n in names}
    for where, obj in _public().items():
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                if f.name in names and f.default is not dataclasses.MISSING:
                    found[f.name][f"{where}:{f.name}"] = f.default
            continue
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            continue
        for p in sig.parameters.values():
            if p.name in names and p.default is not inspect.Parameter.empty:
                found[p.name][f"{where}:{p.name}"] = p.default
    return found


def test_every_options_class_is_scanned():
    """The options classes of every concern are among the scanned public objects, so their
    shared option names are compared too."""
    scanned = {obj for obj in _public().values() if dataclasses.is_dataclass(obj)}
    classes = {KCurveOptions, AlignOptions, DecodeOptions, LensRunOptions, CardOptions,
               SideEffectOptions, TrainingOptions, TraceOptions, ScoringOptions, BuildSettings,
               ExpertSettings}  # fmt: skip
    assert classes <= scanned, classes - scanned


def test_every_public_default_of_a_shared_option_is_the_shared_one():
    found = _defaults()
    assert len(found["batch_size"]) > 20 and len(found["max_new_tokens"]) > 8  # the scan works
    wrong = {
        loc: v for name, locs in found.items() if name in SHARED for loc, v in locs.items()
        if loc not in ALLOWED and v != SHARED[name]
    }  # fmt: skip
    assert wrong == {}, "defaults that disagree with mechlingo.core.defaults: " + str(wrong)
    for name in SAME:
        assert len({repr(v) for v in found[name].values()}) <= 1, (name, found[name])
    located = {loc: v for locs in found.values() for loc, v in locs.items()}
    stale = {loc: v for loc, v in ALLOWED.items() if loc not in located or located[loc] != v}
    assert stale == {}, "ALLOWED entries that no longer match a public default: " + str(stale)


#: the constant of mechlingo.core.defaults each shared option's default must name
CONSTANT: dict[str, str] = {
    "batch_size": "BATCH_SIZE",
    "max_new_tokens": "MAX_NEW_TOKENS",
    "cache": "KV_CACHE",
    "kv_cache": "KV_CACHE",
    "early_stop": "EARLY_STOP",
    "seed": "SEED",
    "progress": "PROGRESS",
}
#: a literal default the typed card budgets replace (their stage settings take the budget's
#: progress); an entry that no longer exists fails, so it is dropped once they land
PENDING: dict[str, str] = {}


def _default_exprs(obj: Any) -> dict[str, tuple[ast.expr, Any]]:
    """``{parameter or field name: (its default as written, the module it is written in)}``
    of a public function, class or dataclass (fields found in the class of the MRO that
    declares them)."""
    out: dict[str, tuple[ast.expr, Any]] = {}
    if dataclasses.is_dataclass(obj):
        for cls in reversed(obj.__mro__):
            if not cls.__module__.startswith("mechlingo") or "__annotations__" not in vars(cls):
                continue
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
            body = tree.body[0].body  # type: ignore[attr-defined]
            mod = importlib.import_module(cls.__module__)
            out.update({st.target.id: (st.value, mod) for st in body if isinstance(st, ast.AnnAssign)
                        and isinstance(st.target, ast.Name) and st.value is not None})  # fmt: skip
        return out
    fn = vars(obj).get("__init__") if inspect.isclass(obj) else obj
    if fn is None or not inspect.isfunction(fn):
        return out
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), fn
    a, mod = node.args, importlib.import_module(fn.__module__)
    pos = [*a.posonlyargs, *a.args]
    pairs = [*zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=True),
             *zip(a.kwonlyargs, a.kw_defaults, strict=True)]  # fmt: skip
    return {x.arg: (d, mod) for x, d in pairs if d is not None}


def _defaults_name(module: Any, expr: ast.expr) -> str | None:
    """The name in :mod:`mechlingo.core.defaults` that ``expr`` (written in ``module``) is:
    a name imported from there, or an attribute of that module; ``None`` otherwise."""
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return expr.attr if getattr(module, expr.value.id, None) is D else None
    if not isinstance(expr, ast.Name):
        return None
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.ImportFrom) and node.module == "mechlingo.core.defaults":
            for alias in node.names:
                if (alias.asname or alias.name) == expr.id:
                    return alias.name
    return None


def test_every_shared_option_default_is_a_named_constant_not_a_literal():
    """Equal values are not enough: every public default of a shared option is written as
    the named constant of mechlingo.core.defaults (a deliberate difference as its own named
    constant, listed in ALLOWED), so changing a shared default is one edit."""
    literal, unnamed, seen = {}, {}, set()
    for where, obj in _public().items():
        for name, (expr, module) in _default_exprs(obj).items():
            if name not in CONSTANT or (isinstance(expr, ast.Constant) and expr.value is None):
                continue
            loc = f"{where}:{name}"
            seen.add(loc)
            if loc in PENDING:
                assert ast.unparse(expr) == PENDING[loc], loc
            elif not isinstance(expr, (ast.Name, ast.Attribute)):
                literal[loc] = ast.unparse(expr)
            elif loc not in ALLOWED and _defaults_name(module, expr) != CONSTANT[name]:
                unnamed[loc] = ast.unparse(expr)
    assert len(seen) > 60  # the scan reads the sources
    assert literal == {}, "literal defaults of shared options (name a constant): " + str(literal)
    assert unnamed == {}, "defaults that are not mechlingo.core.defaults' constant: " + str(unnamed)
    assert set(PENDING) <= seen, "stale PENDING entries: " + str(set(PENDING) - seen)


def _flags() -> dict[tuple[str, str], argparse.Action]:
    """``{(command, flag): action}`` of every (sub)command's shared-name flags."""
    out: dict[tuple[str, str], argparse.Action] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub, sp in a.choices.items():
                    walk(sp, f"{name} {sub}".strip())
            elif a.dest in SHARED and a.option_strings:
                out[(name, a.option_strings[0])] = a

    walk(build_parser(), "")
    return out


def test_every_flag_default_is_the_shared_one():
    # one default per flag in every command (tests/cli/test_glossary.py checks the same
    # across commands): the constant of mechlingo.core.defaults
    flags = _flags()
    assert ("eval", "--batch-size") in flags and ("steer eval", "--max-new-tokens") in flags
    for (cmd, flag), action in flags.items():
        assert action.default == SHARED[action.dest], (cmd, flag, action.default)


def test_steer_commands_take_the_shared_batch_and_answer_length():
    flags = _flags()
    assert flags[("steer build", "--batch-size")].default == BuildSettings.batch_size == 16
    assert flags[("steer eval", "--batch-size")].default == D.BATCH_SIZE == 16
    assert flags[("steer eval", "--max-new-tokens")].default == D.MAX_NEW_TOKENS == 8
    assert flags[("eval", "--max-new-tokens")].default == D.MAX_NEW_TOKENS == 8


def test_each_steer_command_has_one_adapter_whose_defaults_are_the_options():
    from mechlingo.analyses.recall.steer_eval import SteerEvalOptions, run_steer_eval
    from mechlingo.cli.steer import build_options_from_args, eval_options_from_args

    parse = build_parser().parse_args
    assert build_options_from_args(parse(["steer", "build", "--out", "o"])) == BuildSettings()
    got = eval_options_from_args(parse(["steer", "eval", "--vectors", "v", "--quiet",
                                        "--out", "o"]))  # fmt: skip
    assert dataclasses.replace(got, scoring=ScoringOptions()) == SteerEvalOptions()
    assert got.scoring.metric.metric == "generate" and got.scoring.progress is False
    # one options object: every setting in SteerEvalOptions, the checkpoints a keyword
    params = inspect.signature(run_steer_eval).parameters
    assert list(params) == ["model", "facts", "vectors", "options", "checkpoints"]
    assert (
        params["options"].default is None
        and params["checkpoints"].kind is params["checkpoints"].KEYWORD_ONLY
    )
    assert (SteerEvalOptions.seeds, SteerEvalOptions.repeats) == (D.CONTROL_SEEDS, 1)
    odd = eval_options_from_args(parse(["steer", "eval", "--control-seeds", "4,5", "--repeats",
                                        "2", "--transfer-ids", "1,2,3,4", "--out", "o"]))  # fmt: skip
    assert (odd.seeds, odd.repeats, odd.matrix.build_ids, odd.matrix.test_ids) == ((4, 5), 2, 1, 4)
    with pytest.raises(InputError, match="repeats must be at least 1"):
        SteerEvalOptions(repeats=0)
    with pytest.raises(InputError, match="--control-seeds needs at least one seed"):
        SteerEvalOptions(seeds=())


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: ScoringOptions(max_new_tokens=0), "max_new_tokens (--max-new-tokens)"),
        (lambda: ScoringOptions(batch_size=-1), "batch_size (--batch-size)"),
        (lambda: ScoringOptions(metric="greedy"), "pass 'generate', 'rank', 'klar'"),
        (lambda: BuildSettings(k_shot=0), "k_shot (--k-shot)"),
        (lambda: BuildSettings(unit="norm"), "pass 'resid' or 'raw'"),
        (lambda: ExpertSettings(samples=0), "samples must be an integer of at least 1"),
        (lambda: ExpertSettings(pool="sum"), "pass one of mean, max"),  # type: ignore[arg-type]
        (lambda: TrainingOptions(steps=0), "steps (--steps)"),
        (lambda: TrainingOptions(lr=0), "lr (--lr) must be above 0"),
        (lambda: TrainingOptions(vocab_sample="some"), "pass None (exact), 'auto'"),
        (lambda: TrainingOptions.of({"step": 3}), "unknown tuned-lens settings ['step']"),
        (lambda: TraceOptions(method="fast"), "pass one of exact, atp, both"),
        (lambda: TraceOptions(patch_prompts=-1), "patch_prompts (--patch-prompts)"),
        (lambda: TraceOptions(patch_sites=()), "pass at least one site (--patch-sites)"),
        (lambda: D.check_seeds([]), "seeds needs at least one seed"),
        (lambda: KCurveOptions(n_samples=0), "n_samples must be >= 1"),
        (lambda: KCurveOptions(value="max"), "pass one of mean, median"),  # type: ignore[arg-type]
        (lambda: AlignOptions(batch_size=0), "batch_size must be an integer of at least 1"),
        (lambda: DecodeOptions(batch_size=0), "batch_size (--batch-size) must be at least 1"),
        (lambda: DecodeOptions(max_new_tokens=-1), "max_new_tokens must be >= 0"),
        (lambda: LensRunOptions(chunk_rows=0), "chunk_rows must be an integer of at least 1"),
        (lambda: CardOptions(paper="x"), "paper must be one of"),
        (lambda: CardOptions(metric="x"), "metric must be one of"),
        (lambda: CardData(external_metric="x"), "external_metric must be one of"),
        (lambda: SideEffectOptions(n_boot=0), "n_boot must be an integer of at least 1"),
        (lambda: D.check_seeds((), what="--control-seeds"), "--control-seeds needs at least one"),
    ],
)
def test_options_refuse_bad_values_in_one_line(make, says):
    with pytest.raises(MechlingoError) as err:
        make()
    assert says in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, InputError) or type(err.value).__name__ in (
        "ExpertError", "AlignmentError", "SideEffectsError")  # fmt: skip


def test_scoring_options_pass_the_kv_cache_and_early_stop_on():
    kw = ScoringOptions(cache=False, early_stop=False, max_new_tokens=3).kw()
    assert kw == {"decoding": DecodeOptions(max_new_tokens=3, batch_size=64, progress=False,
                                            cache=False, early_stop=False)}  # fmt: skip
    assert TrainingOptions.of(None) == TrainingOptions()
    assert TrainingOptions.of({"steps": 3}).kw()["steps"] == 3
    assert D.check_seeds(("1", 2)) == [1, 2]
    # run_trace takes TraceOptions (its defaults written once, there)
    params = inspect.signature(run_trace).parameters
    assert list(params) == ["model", "facts", "options"] and params["options"].default is None


def test_the_scoring_options_are_the_decoding_options_and_a_metric():
    """One decoding options type: ``ScoringOptions`` is a ``DecodeOptions`` (its fields and
    checks) with the steering defaults and a metric, and every scoring function takes the
    decoding options as one ``decoding`` argument (no decoding keyword of its own)."""
    from mechlingo.scoring import evaluate as ev

    decode = [f.name for f in dataclasses.fields(DecodeOptions)]
    assert issubclass(ScoringOptions, DecodeOptions)
    assert [f.name for f in dataclasses.fields(ScoringOptions)] == [*decode, "metric"]
    for fn in (ev.evaluate_facts, ev.evaluate_conditions, ev.greedy_generate,
               ev.generate_conditions):  # fmt: skip
        params = inspect.signature(fn).parameters
        assert params["decoding"].default is None and not set(decode) & set(params), fn
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), fn
    assert not [n for n, o in vars(ev).items() if isinstance(o, type) and n.endswith("Args")]
    opt = ScoringOptions(metric="rank", max_new_tokens=3, cache=False)
    assert opt.decode() == DecodeOptions(max_new_tokens=3, batch_size=D.STEER_BATCH_SIZE,
                                         cache=False)  # fmt: skip
    with pytest.raises(InputError, match=r"batch_size \(--batch-size\) must be at least 1"):
        DecodeOptions(batch_size=0)
    with pytest.raises(TypeError):  # keywords only: a field order cannot misplace a value
        ScoringOptions("rank")  # type: ignore[misc]


def test_the_templates_families_are_measured_and_natural_only(capsys, tmp_path):
    from mechlingo.cli import main
    from mechlingo.data import load_facts

    measured = load_facts(langs=["fr"], relations=["capital"], limit=2, templates="measured")
    natural = load_facts(langs=["fr"], relations=["capital"], limit=2, templates="natural")
    assert [f.prompt for f in natural] != [f.prompt for f in measured]
    with pytest.raises(InputError, match="templates must be one of"):
        load_facts(langs=["fr"], relations=["capital"], limit=2, templates="tuned")
    # the command line has no old names: --templates takes natural or measured only
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--langs", "fr", "--limit", "2", "--templates", "tuned", "--dry-run",
              "--out", str(tmp_path / "o")])  # fmt: skip
    assert exc.value.code == 2
    assert "invalid choice: 'tuned'" in capsys.readouterr().err


def test_chat_model_names_have_their_own_word():
    from mechlingo.core import tokens

    assert tokens.looks_chat_model("google/gemma-3-1b-it") is True
    assert tokens.looks_chat_model("google/gemma-3-270m") is False
    assert tokens.looks_chat_model("Qwen2.5-0.5B-Instruct") is True
    assert not hasattr(tokens, "looks_chat_tuned")


def test_checkpoints_and_the_kv_cache_are_separate_names():
    from mechlingo.analyses.experts.kcurve import k_curve
    from mechlingo.analyses.recall.steer_eval import evaluate_test
    from mechlingo.core.artifacts import cleanup_stale
    from mechlingo.scoring.evaluate import DecodeOptions, evaluate_conditions

    assert "checkpoint" in inspect.signature(evaluate_test).parameters
    assert "checkpoint" in inspect.signature(k_curve).parameters
    assert "cache" not in inspect.signature(evaluate_test).parameters
    assert DecodeOptions.cache is D.KV_CACHE
    assert "cache" not in inspect.signature(evaluate_conditions).parameters  # in decoding
    assert "model_cache" in inspect.signature(cleanup_stale).parameters


def test_no_settings_lookup_falls_back_to_a_literal_batch_or_length():
    import re
    from pathlib import Path

    pattern = re.compile(r"""\.get\(\s*["'](batch_size|max_new_tokens)["']\s*,\s*\d+\s*\)""")
    root = Path(mechlingo.__file__).parent
    found = [f"{p.relative_to(root)}: {m.group(0)}" for p in sorted(root.rglob("*.py"))
             for m in pattern.finditer(p.read_text(encoding="utf-8"))]  # fmt: skip
    assert found == []


def test_the_patching_readout_has_its_own_name(tiny):
    from mechlingo.analyses.recall.patching import attention_knockout, patch_activations
    from mechlingo.analyses.recall.patching.readouts import fact_readouts
    from mechlingo.data import load_facts

    facts = load_facts(langs=["en"], relations=["capital"], limit=2)
    readout = fact_readouts(tiny, facts)
    kw = {"layers": [0], "positions": [-1]}
    new = patch_activations(tiny, facts, facts, "resid_pre", readout=readout, **kw)
    default = patch_activations(tiny, facts, facts, "resid_pre", **kw)  # the same readout
    assert torch.equal(new.values, default.values)
    with pytest.raises(MechlingoError, match="unknown patching keyword 'metric'"):
        patch_activations(tiny, facts, facts, "resid_pre", metric=readout, **kw)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="metric"):
        attention_knockout(tiny, facts, [(0, 0)], metric=readout[0])  # type: ignore[call-arg]


def test_the_patching_results_read_a_readout(tiny):
    from mechlingo.analyses.recall import patching
    from mechlingo.data import load_facts

    facts = load_facts(langs=["en"], relations=["capital"], limit=2)
    res = patching.patch_activations(tiny, facts, facts, "resid_pre", layers=[0, 1], positions=[-1])
    last = len(res.readout_names) - 1
    assert last >= 1 and res.readout_index(res.readout_names[last]) == last
    with pytest.raises(KeyError, match="unknown readout 'nope'"):
        res.readout_index("nope")
    assert patching.readout_index(res.readout_names, res.readout_names[last]) == last
    assert not hasattr(res, "metric_index") and not hasattr(patching, "metric_index")
    want = (res.values[last] - res.corrupted[last]).mean(-1)  # the effect, by hand
    assert torch.equal(res.effect(readout=res.readout_names[last]), want)
    grid = res.grid("resid_pre", readout=last, value="effect")  # [layer, position]
    assert torch.equal(grid[:, 0], want)
    with pytest.raises(TypeError, match="metric"):
        res.effect(metric=0)  # type: ignore[call-arg]


def test_the_stop_message_finds_the_work_folder_without_a_private_attribute(tmp_path):
    cli_main = importlib.import_module("mechlingo.cli.main")

    ns = argparse.Namespace(out=str(tmp_path / "o"), work=None)
    assert cli_main._work_of(ns) == tmp_path / ".o.work"
    ns = argparse.Namespace(out=str(tmp_path / "o"), work=str(tmp_path / "w"))
    assert cli_main._work_of(ns) == tmp_path / "w"
    assert cli_main._work_of(argparse.Namespace(out=str(tmp_path / "o"))) is None  # no --work
    inside = argparse.Namespace(out=str(tmp_path / "o"), work=str(tmp_path / "o" / "w"))
    assert cli_main._work_of(inside) is None  # refused by --work's own check
    assert not [k for k in vars(cli_main.build_parser().parse_args(["eval", "--out", "x"]))
                if k.startswith("_run")]  # fmt: skip

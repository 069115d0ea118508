"""One name per concept, one meaning per flag: every command's parser against the glossary
(``mechlingo.cli.glossary.FLAGS`` and ``docs/glossary.md``), and old flag names refused with
the name that replaced them."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from mechlingo.cli import build_parser, main
from mechlingo.cli.glossary import CODE_NAMES, FLAGS, RETIRED

DOC = Path(__file__).resolve().parents[2] / "docs" / "glossary.md"
#: flags argparse adds itself
_BUILTIN = {"--help", "--version"}


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict:
    """``{"lens": parser, "steer build": parser, ...}``: every (sub)command's parser."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(_commands(sub, f"{prefix} {name}".strip()))
    if prefix and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
        out[prefix] = parser
    return out


def _kind(action: argparse.Action) -> tuple:
    """What a flag is, as far as a parser says: its action (switch or value), the type its
    value is converted with, its metavar, its choices and its nargs."""
    if action.nargs == 0:
        return ("switch",)
    kind = getattr(action.type, "__name__", "str") if action.type else "str"
    choices = tuple(sorted(action.choices)) if action.choices else None
    return ("value", kind, action.metavar, choices, action.nargs)


def flag_table(parsers: dict) -> dict[str, dict[str, tuple]]:
    """``{flag: {command: kind}}`` over ``parsers``."""
    table: dict[str, dict[str, tuple]] = {}
    for cmd, p in parsers.items():
        for action in p._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt not in _BUILTIN:
                    table.setdefault(opt, {})[cmd] = _kind(action)
    return table


def two_meanings(table: dict[str, dict[str, tuple]]) -> dict[str, dict[str, tuple]]:
    """The flags whose kind differs between commands (``--side-effects DIR`` in one,
    ``--side-effects N`` in another)."""
    return {f: by for f, by in table.items() if len(set(by.values())) > 1}


COMMANDS = _commands(build_parser())
TABLE = flag_table(COMMANDS)


def _doc_rows() -> dict[str, tuple[str, str, str]]:
    """The "Every flag" table of docs/glossary.md: ``{flag: (concept, meaning, commands)}``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Every flag", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `(--[\w-]+)` \| (.*?) \| (.*?) \| (.*?) \|$", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} is listed twice in {DOC.name}"
            rows[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    return rows


def test_the_checker_finds_a_flag_with_two_meanings():
    a, b = argparse.ArgumentParser(), argparse.ArgumentParser()
    a.add_argument("--side-effects", metavar="DIR")
    b.add_argument("--side-effects", type=int, metavar="N")
    found = two_meanings(flag_table({"steer eval": a, "align": b}))
    assert set(found) == {"--side-effects"}
    c = argparse.ArgumentParser()
    c.add_argument("--side-effects", action="store_true")
    assert two_meanings(flag_table({"x": c, "y": c})) == {}


def test_every_command_is_checked():
    assert {"lens", "eval", "trace", "experts", "align", "tuned-lens", "replicate",
            "steer build", "steer eval"} <= set(COMMANDS)  # fmt: skip


def test_no_flag_has_two_meanings_across_commands():
    assert two_meanings(TABLE) == {}


def test_every_flag_is_in_the_glossary_and_every_glossary_flag_exists():
    assert sorted(set(TABLE) - set(FLAGS)) == [], "flags missing from mechlingo.cli.glossary"
    assert sorted(set(FLAGS) - set(TABLE)) == [], "glossary flags that no command takes"


def test_no_concept_has_two_flags():
    by_concept: dict[str, list[str]] = {}
    for flag, (concept, _meaning) in FLAGS.items():
        by_concept.setdefault(concept.lower(), []).append(flag)
    assert {c: f for c, f in by_concept.items() if len(f) > 1} == {}


def test_docs_table_is_the_glossary_both_ways():
    rows = _doc_rows()
    assert set(rows) == set(FLAGS)
    for flag, (concept, meaning) in FLAGS.items():
        assert rows[flag][:2] == (concept, meaning), flag
        cmds = sorted(TABLE[flag])
        shown = rows[flag][2]
        expected = "every command" if len(cmds) == len(COMMANDS) else None
        assert shown == expected or sorted(shown.split(", ")) == cmds, (flag, shown, cmds)


def _keywords(obj) -> set[str]:
    """The keywords ``obj`` takes: its parameters and the keys of a ``**kw: Unpack[TD]``."""
    import inspect
    import typing

    params = inspect.signature(obj).parameters
    names = set(params)
    for p in params.values():
        text = str(p.annotation)  # "Unpack[SiteGridArgs]" (postponed annotations)
        if p.kind is p.VAR_KEYWORD and text.startswith("Unpack[") and text.endswith("]"):
            typed = obj.__globals__[text[len("Unpack[") : -1]]
            names |= set(typing.get_type_hints(typed))
    return names


def test_every_code_word_has_one_name_per_meaning_in_the_code_and_the_page():
    import importlib
    import inspect

    text = DOC.read_text()
    for word, meanings in CODE_NAMES.items():
        assert len({m for m, _ in meanings}) == len(meanings) > 1, word
        for meaning, where in meanings:
            assert f"| {word} | {meaning} |" in text, (word, meaning)
            module, name, *param = where.split(":")
            obj = getattr(importlib.import_module(module), name)
            if param:
                assert param[0] in _keywords(obj), where
    # the stage-store meaning no longer shares the KV cache's name
    from mechlingo.analyses.experts.kcurve import k_curve

    assert "cache" not in inspect.signature(k_curve).parameters
    # nor does the patching readout share the scoring rule's name
    from mechlingo.analyses.recall.attribution import NeuronAttribution, compare_patching
    from mechlingo.analyses.recall.patching import PatchingResult

    for fn in (PatchingResult.effect, PatchingResult.grid, PatchingResult.readout_index,
               NeuronAttribution.top, compare_patching):  # fmt: skip
        params = inspect.signature(fn).parameters
        assert "readout" in params and "metric" not in params, fn.__qualname__
    fields = {f.name for f in dataclasses.fields(PatchingResult)}
    assert "readout_names" in fields and "metric_names" not in fields


def test_retired_names_are_gone_and_their_replacements_exist():
    for cmd, renamed in RETIRED.items():
        parsers = [p for name, p in COMMANDS.items() if name.split()[0] == cmd]
        assert parsers, cmd
        for old, new in renamed.items():
            for p in parsers:
                opts = {o for a in p._actions for o in a.option_strings}
                assert old not in opts, f"{cmd} still takes {old}"
            assert new.split()[0] in TABLE, new
            assert any(cmd == name.split()[0] for name in TABLE[new.split()[0]]), (cmd, new)


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["experts", "--lang", "es"], "--lang is now --target"),
        (["experts", "--data", "D"], "--data is now --parallel"),
        (["experts", "--limit", "5"], "--limit is now --lines"),
        (["experts", "--layer", "3"], "--layer is now --layers"),
        (["experts", "--new-tokens", "3"], "--new-tokens is now --max-new-tokens"),
        (["align", "--split", "dev"], "--split is now --flores-split"),
        (["eval", "--data=f.jsonl"], "--data is now --facts"),
        (["lens", "--patchscope-tokens", "3"], "--patchscope-tokens is now --max-new-tokens"),
        (["steer", "eval", "--seeds", "0,1"], "--seeds is now --control-seeds"),
        (["tuned-lens", "--text", "D"], "--text is now --parallel"),
        (["tuned-lens", "--lines", "0:800"], "--offset START --lines N"),
        (["align", "--side-effects", "20"], "--side-effects-lines N"),
        (["steer", "eval", "--side-effects", "D"], "add --parallel DIR"),
    ],
)
def test_an_old_flag_name_fails_with_one_line_naming_the_new_one(argv, hint, tmp_path, capsys):
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert hint in err
    assert not out.exists()


def test_a_flag_is_never_taken_by_a_prefix(tmp_path, capsys):
    # --lang must not quietly become --langs, nor --seed become --control-seeds
    for argv, unknown in ((["eval", "--lang", "en"], "--lang en"),
                          (["experts", "--target", "es", "--seed", "1", "--lin", "4"], "--lin 4")):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--out", str(tmp_path / "o")])
        assert exc.value.code == 2
        assert f"unrecognized arguments: {unknown}" in capsys.readouterr().err


#: flags whose default the parser keeps elsewhere (``None`` on the flag: the command's own
#: default is applied when the facts are read)
_EFFECTIVE = {"--langs": "_langs_default", "--templates": "_templates_default",
              "--relation": "_relation_default"}  # fmt: skip
#: ``(default X: reason)`` or ``(default: X: reason)`` in a help
_REASONED = re.compile(r"default:? [^()]*?: \w")


def _defaults(parsers: dict) -> dict[str, dict[str, tuple[object, str]]]:
    """``{flag: {command: (effective default, help)}}`` of the flags several commands take."""
    table: dict[str, dict[str, tuple[object, str]]] = {}
    for cmd, p in parsers.items():
        for action in p._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt not in _BUILTIN:
                    value = action.default
                    if value is None and opt in _EFFECTIVE:
                        value = p.get_default(_EFFECTIVE[opt])
                    table.setdefault(opt, {})[cmd] = (value, action.help or "")
    return {f: by for f, by in table.items() if len(by) > 1}


def unexplained_defaults(parsers: dict) -> dict[str, list[str]]:
    """``{flag: [commands]}``: a shared flag whose defaults differ, in the commands that do not
    say theirs with its reason. The shared default is the one of a strict majority of the
    commands (they need no reason); without a majority every command must give one."""
    bad: dict[str, list[str]] = {}
    for flag, by in _defaults(parsers).items():
        values = [repr(v) for v, _ in by.values()]
        if len(set(values)) == 1:
            continue
        top = max(set(values), key=values.count)
        shared = top if values.count(top) * 2 > len(values) else None
        for cmd, (value, text) in by.items():
            if repr(value) == shared:
                continue
            stated = value is None or str(value) in text
            if not (stated and _REASONED.search(text)):
                bad.setdefault(flag, []).append(cmd)
    return bad


def test_the_default_checker_finds_an_unexplained_default():
    a, b, c = argparse.ArgumentParser(), argparse.ArgumentParser(), argparse.ArgumentParser()
    for p in (a, b):
        p.add_argument("--limit", type=int, default=50, help="facts (default 50)")
    c.add_argument("--limit", type=int, default=10, help="facts (default 10)")
    assert unexplained_defaults({"a": a, "b": b, "c": c}) == {"--limit": ["c"]}
    c._actions[-1].help = "facts (default 10: each costs a minute)"
    assert unexplained_defaults({"a": a, "b": b, "c": c}) == {}
    # no majority: every command states its reason
    assert unexplained_defaults({"a": a, "c": c}) == {"--limit": ["a"]}


def test_every_shared_flag_has_one_default_or_each_command_says_why():
    assert unexplained_defaults(COMMANDS) == {}


def test_no_help_shows_an_empty_default(capsys):
    for cmd, p in COMMANDS.items():
        text = p.format_help()
        assert "(default: )" not in text and "default: ," not in text, cmd

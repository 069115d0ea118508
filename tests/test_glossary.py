"""One name per concept, one meaning per flag: every command's parser against the glossary
(``mechlingo.cli.glossary.FLAGS`` and ``docs/glossary.md``), and old flag names refused with
the name that replaced them."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from mechlingo.cli import build_parser, main
from mechlingo.cli.glossary import FLAGS, RETIRED

DOC = Path(__file__).resolve().parents[1] / "docs" / "glossary.md"
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

"""One name per concept, one meaning and one default per flag: every command's parser against
the glossary (``mechlingo.cli.glossary.FLAGS`` and ``docs/glossary.md``), and every default
shown in ``--help``."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from mechlingo.cli import build_parser, main
from mechlingo.cli.glossary import CODE_NAMES, FLAGS, about

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


def _meaning(flag: str, action: argparse.Action) -> str:
    """The meaning a command gives ``flag``: the glossary's when its help starts with it
    (the command took it from :func:`mechlingo.cli.glossary.about`), else its whole help."""
    text = action.help or ""
    meaning = FLAGS[flag][1].replace("%", "%%") if flag in FLAGS else None
    return FLAGS[flag][1] if meaning is not None and text.startswith(meaning) else text


def flag_table(parsers: dict) -> dict[str, dict[str, tuple]]:
    """``{flag: {command: (kind, meaning, default)}}`` over ``parsers``."""
    table: dict[str, dict[str, tuple]] = {}
    for cmd, p in parsers.items():
        for action in p._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt not in _BUILTIN:
                    entry = (_kind(action), _meaning(opt, action), repr(action.default))
                    table.setdefault(opt, {})[cmd] = entry
    return table


def two_meanings(table: dict[str, dict[str, tuple]]) -> dict[str, list[str]]:
    """``{flag: [what differs]}``: the flags whose kind (``--side-effects DIR`` in one
    command, ``--side-effects N`` in another), meaning (the help of one command not taken from
    the glossary) or default differs between the commands that take them."""
    bad: dict[str, list[str]] = {}
    for flag, by in table.items():
        for i, what in enumerate(("kind", "meaning", "default")):
            if len({entry[i] for entry in by.values()}) > 1:
                bad.setdefault(flag, []).append(what)
    return bad


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
    assert found == {"--side-effects": ["kind"]}
    c = argparse.ArgumentParser()
    c.add_argument("--side-effects", action="store_true", help=about("--side-effects"))
    assert two_meanings(flag_table({"x": c, "y": c})) == {}


def test_the_checker_finds_a_flag_with_two_help_meanings():
    # one command takes --max-new-tokens' meaning from the glossary, a throwaway one writes
    # its own (the patchscope's continuation under the answer-length flag)
    good, bad = argparse.ArgumentParser(), argparse.ArgumentParser()
    good.add_argument("--max-new-tokens", type=int, default=8,
                      help=about("--max-new-tokens", "a command's own detail"))  # fmt: skip
    bad.add_argument("--max-new-tokens", type=int, default=8,
                     help="greedy tokens of the patchscope's continuation")  # fmt: skip
    assert two_meanings(flag_table({"eval": good, "lens": bad})) == {
        "--max-new-tokens": ["meaning"]
    }
    # details after the glossary's meaning may differ: the meaning is the same
    other = argparse.ArgumentParser()
    other.add_argument("--max-new-tokens", type=int, default=8, help=about("--max-new-tokens"))
    assert two_meanings(flag_table({"eval": good, "trace": other})) == {}


def test_the_checker_finds_a_flag_with_two_defaults():
    parsers = {}
    for cmd, default in (("trace", "en,fr,de,es"), ("lens", None), ("eval", None)):
        p = argparse.ArgumentParser()
        p.add_argument("--langs", default=default, help=about("--langs"))
        parsers[cmd] = p
    assert two_meanings(flag_table(parsers)) == {"--langs": ["default"]}
    parsers["trace"]._actions[-1].default = None
    assert two_meanings(flag_table(parsers)) == {}


def test_every_real_parser_passes_the_checker_and_a_conflict_added_to_it_fails():
    # the real parsers pass; one throwaway command with a second default for --limit fails
    throwaway = argparse.ArgumentParser()
    throwaway.add_argument("--limit", type=COMMANDS["eval"]._option_string_actions["--limit"].type,
                           default=10, metavar="N|all", help=about("--limit"))  # fmt: skip
    assert two_meanings(flag_table({**COMMANDS, "throwaway": throwaway})) == {
        "--limit": ["default"]
    }


def test_every_command_is_checked():
    assert {"lens", "eval", "trace", "experts", "align", "tuned-lens", "replicate",
            "steer build", "steer eval"} <= set(COMMANDS)  # fmt: skip


def test_no_flag_has_two_meanings_or_two_defaults_across_commands():
    assert two_meanings(TABLE) == {}


def test_every_help_takes_its_meaning_from_the_glossary():
    own = {(cmd, flag) for flag, by in TABLE.items() for cmd, entry in by.items()
           if flag in FLAGS and entry[1] != FLAGS[flag][1]}  # fmt: skip
    assert sorted(own) == []


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


def test_a_flag_is_never_taken_by_a_prefix(tmp_path, capsys):
    # --lang must not quietly become --langs, nor --seed become --control-seeds
    for argv, unknown in ((["eval", "--lang", "en"], "--lang en"),
                          (["experts", "--target", "es", "--seed", "1", "--lin", "4"], "--lin 4")):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--out", str(tmp_path / "o")])
        assert exc.value.code == 2
        assert f"unrecognized arguments: {unknown}" in capsys.readouterr().err


def _help_lines(p: argparse.ArgumentParser) -> dict[argparse.Action, str]:
    """``{action: the help --help prints for it}``, as the parser's formatter expands it."""
    fmt = p._get_formatter()
    return {
        a: fmt._expand_help(a) for a in p._actions if a.help and a.help is not argparse.SUPPRESS
    }


def unshown_defaults(parsers: dict) -> dict[str, list[str]]:
    """``{command: [flags]}`` whose ``--help`` hides the default: a value default not printed
    in the flag's help, or an optional value flag without a default whose help does not say
    what happens when it is omitted (``default: ...``)."""
    bad: dict[str, list[str]] = {}
    for cmd, p in parsers.items():
        for action, text in _help_lines(p).items():
            if not action.option_strings or action.option_strings[0] in _BUILTIN:
                continue
            default = action.default
            if action.nargs == 0 or action.required:  # a switch is off unless given
                continue
            if default is None:
                shown = "default:" in text or "default " in text
            else:
                value = ",".join(map(str, default)) if isinstance(default, list) else str(default)
                shown = "default" in text and value in text
            if not shown:
                bad.setdefault(cmd, []).append(action.option_strings[0])
    return bad


def test_the_default_checker_finds_a_hidden_default():
    p = argparse.ArgumentParser()
    p.add_argument("--limit", type=int, default=50, help="facts per relation")
    p.add_argument("--relation", default=None, help="relations")
    assert unshown_defaults({"x": p}) == {"x": ["--limit", "--relation"]}
    from mechlingo.cli.flags import HelpParser

    q = HelpParser()
    q.add_argument("--limit", type=int, default=50, help="facts per relation")
    q.add_argument("--relation", default=None, help="relations (default: capital)")
    q.add_argument("--quiet", action="store_true", help="no progress bars")
    assert unshown_defaults({"y": q}) == {}


def test_every_default_is_shown_in_help():
    assert unshown_defaults(COMMANDS) == {}


def test_no_help_shows_an_empty_default(capsys):
    for cmd, p in COMMANDS.items():
        text = p.format_help()
        assert "(default: )" not in text and "default: ," not in text, cmd


def test_every_command_reads_the_same_languages_and_limit_by_default():
    from mechlingo.cli import common
    from mechlingo.data import LANGS

    parse = build_parser().parse_args
    five = ["en", "fr", "de", "es", "ja"]
    for argv in (["lens"], ["eval"], ["trace"], ["steer", "build"], ["steer", "eval"]):
        args = parse([*argv, "--out", "o"])
        assert common.selected_langs(args) == five and args.limit == 50, argv
        assert common.selected_langs(parse([*argv, "--langs", "all", "--out", "o"])) == list(LANGS)
        assert parse([*argv, "--limit", "all", "--out", "o"]).limit is None
    assert common.parallel_langs(parse(["tuned-lens", "--out", "o"])) == five
    assert common.parallel_langs(parse(["align", "--out", "o"])) == five
    # the experts' target is read besides --langs; a --parallel folder: all its languages
    args = parse(["experts", "--target", "hi", "--out", "o"])
    assert common.parallel_langs(args, ["hi"]) == [*five, "hi"]
    args = parse(["experts", "--target", "hi", "--parallel", "P", "--out", "o"])
    assert common.parallel_langs(args, ["hi"]) is None
    args = parse(["experts", "--target", "hi", "--langs", "en,fr", "--parallel", "P", "--out", "o"])
    assert common.parallel_langs(args, ["hi"]) == ["en", "fr", "hi"]


def _documented_commands() -> list[tuple[str, list[str]]]:
    """``(page, argv)`` of every ``mechlingo COMMAND ...`` line in the fenced code blocks of
    README.md and docs/ (the replicate log keeps the commands as they were run)."""
    import shlex

    root = DOC.parents[1]
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    found = []
    for page in pages:
        if page.name == "replicate-log.md":
            continue
        for block in re.findall(r"```[a-z]*\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            block = block.replace("\\\n", " ")
            names = dict(re.findall(r'^(\w+)="([^"]*)"$', block, flags=re.M))
            for line in block.splitlines():
                m = re.search(r"(?:^|\s)mechlingo ([\w-]+(?: .*)?)$", line.strip())
                if not m or m.group(1).split()[0] not in set(COMMANDS) | {"steer"}:
                    continue
                if "[" in m.group(1):  # a usage synopsis, [--flag A|B]
                    continue
                text = m.group(1)
                for name, value in names.items():
                    text = text.replace(f"${name}", value)
                argv = shlex.split(text.split(" #")[0].split("&&")[0])
                found.append((page.name, argv + ([] if "--out" in argv else ["--out", "o"])))
    return found


def test_every_documented_command_line_parses(capsys):
    found = _documented_commands()
    assert len(found) >= 15  # the scan works
    parser, bad = build_parser(), []
    for page, argv in [*found, ("stale", ["replicate", "--metric", "rank", "--out", "o"])]:
        try:
            parser.parse_args(argv)
        except SystemExit:
            bad.append((page, " ".join(argv), capsys.readouterr().err.strip().splitlines()[-1]))
    assert [b[0] for b in bad] == ["stale"], bad  # a flag a page names but no parser has fails

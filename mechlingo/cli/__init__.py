"""The ``mechlingo`` command line: one thin module per command (parse, call the library,
write). :func:`main` runs a command line; the console script and ``python -m mechlingo`` enter
through ``mechlingo.__main__``, which turns a Ctrl-C during these imports into one line
(``python -m mechlingo.cli`` works too, without that)."""

from mechlingo.cli.common import UsageError, command, split_list
from mechlingo.cli.main import build_parser, main

__all__ = ["UsageError", "build_parser", "command", "main", "split_list"]

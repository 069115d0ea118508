"""The ``mechlingo`` command line: one thin module per command (parse, call the library,
write). ``mechlingo.cli:main`` is the console entry point; ``python -m mechlingo.cli`` works
too."""

from mechlingo.cli.common import UsageError, command, split_list
from mechlingo.cli.main import build_parser, main

__all__ = ["UsageError", "build_parser", "command", "main", "split_list"]

"""``python -m mechlingo`` and the ``mechlingo`` console script (``mechlingo.__main__:main``).

Ctrl-C is one line and exit status 130 from the first instant: ``import mechlingo`` loads
nothing heavy (its names load on first use), so the first thing that runs here is the
``try`` around the import of the command line, which loads torch, transformers and
TransformerLens (seconds). A Ctrl-C during those imports ends with one line instead of a
traceback from inside torch; once :func:`mechlingo.cli.main.main` runs it handles every
signal itself."""

import sys

try:
    from mechlingo.cli.main import main as _main
except KeyboardInterrupt:
    print("mechlingo: stopped by SIGINT while starting; nothing was written", file=sys.stderr)
    sys.exit(130)


def main() -> int:
    """The ``mechlingo`` command: :func:`mechlingo.cli.main.main` on ``sys.argv``."""
    return _main()


if __name__ == "__main__":
    sys.exit(main())

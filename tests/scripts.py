"""The repository's ``scripts/`` as modules, for the tests that call their functions."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported as the module ``name`` (once per process), with
    ``scripts/`` on the import path after everything else, as the scripts import each other
    (``tuned_lens_setup``, ``notebook_outputs``)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))
    return importlib.import_module(name)

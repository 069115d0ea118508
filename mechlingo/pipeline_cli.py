"""Deprecated: moved to :mod:`mechlingo.cli.trace` (mechlingo-shim, removed in 0.2).

``import mechlingo.pipeline_cli`` still works for one release and gives the moved module itself
(so attributes, monkeypatching and saved artifacts behave as before), with a
DeprecationWarning.
"""

import importlib
import sys
import warnings

warnings.warn(
    "mechlingo.pipeline_cli moved to mechlingo.cli.trace; import it from there "
    "(the old path is removed in mechlingo 0.2)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = importlib.import_module("mechlingo.cli.trace")

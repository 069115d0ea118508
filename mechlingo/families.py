"""Deprecated: moved to :mod:`mechlingo.core.families` (mechlingo-shim, removed in 0.2).

``import mechlingo.families`` still works for one release and gives the moved module itself
(so attributes, monkeypatching and saved artifacts behave as before), with a
DeprecationWarning.
"""

import importlib
import sys
import warnings

warnings.warn(
    "mechlingo.families moved to mechlingo.core.families; import it from there "
    "(the old path is removed in mechlingo 0.2)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = importlib.import_module("mechlingo.core.families")

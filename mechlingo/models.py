"""Deprecated: moved to :mod:`mechlingo.core.models` (mechlingo-shim, removed in 0.2).

``import mechlingo.models`` still works for one release and gives the moved module itself
(so attributes, monkeypatching and saved artifacts behave as before), with a
DeprecationWarning.
"""

import importlib
import sys
import warnings

warnings.warn(
    "mechlingo.models moved to mechlingo.core.models; import it from there "
    "(the old path is removed in mechlingo 0.2)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = importlib.import_module("mechlingo.core.models")

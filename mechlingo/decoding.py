"""Deprecated: moved to :mod:`mechlingo.activations.decoding` (mechlingo-shim, removed in 0.2).

``import mechlingo.decoding`` still works for one release and gives the moved module itself
(so attributes, monkeypatching and saved artifacts behave as before), with a
DeprecationWarning.
"""

import importlib
import sys
import warnings

warnings.warn(
    "mechlingo.decoding moved to mechlingo.activations.decoding; import it from there "
    "(the old path is removed in mechlingo 0.2)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = importlib.import_module("mechlingo.activations.decoding")

"""Deprecated: moved to :mod:`mechlingo.viz.common`; ``table_html`` to
:mod:`mechlingo.report.tables` (mechlingo-shim, removed in 0.2)."""

import warnings
from typing import Any

from mechlingo.report import tables as _tables
from mechlingo.viz import common as _common

warnings.warn(
    "mechlingo.plots moved to mechlingo.viz.common (table_html to mechlingo.report.tables); "
    "import it from there (the old path is removed in mechlingo 0.2)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    if name == "table_html":
        return _tables.table_html
    return getattr(_common, name)

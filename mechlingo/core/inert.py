"""Text that stays text in a spreadsheet: every CSV mechlingo writes goes through
:func:`inert_csv`.

A cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is read by
spreadsheet programs (Excel, LibreOffice, Google Sheets) as a formula, so an answer in a facts
file such as ``=HYPERLINK("http://evil", "Paris")`` would become a live formula when a
colleague opens ``lens.csv``. OWASP's guidance on CSV injection is followed: such a text cell
gets a single quote in front (``'=HYPERLINK(...)``), which the spreadsheet shows as text.
Numbers are left as they are (a negative number is a number, not a formula), and the JSON
files keep every value as it was (a JSON string is never evaluated). Details:
``docs/security.md``. This module imports nothing from mechlingo."""

from __future__ import annotations

import csv
from typing import Any

__all__ = ["FORMULA_STARTS", "inert_cell", "inert_csv"]

#: the first characters that make a spreadsheet evaluate a cell
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def inert_cell(value: Any) -> Any:
    """``value`` with a ``'`` in front when it is a string that a spreadsheet would evaluate
    (it starts with one of :data:`FORMULA_STARTS`); anything else unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def inert_csv(frame: Any) -> str:
    """A pandas ``DataFrame`` as CSV text (no index), every text cell and column name passed
    through :func:`inert_cell`. The frame itself is not changed."""
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype.kind == "O":  # text (or mixed) columns; numbers stay numbers
            out[col] = out[col].map(inert_cell)
    out.columns = [inert_cell(c) for c in out.columns]
    # a carriage return inside a cell would end the row for a CSV reader unless the cell is
    # quoted (pandas quotes only cells with a comma, a quote or a newline): then every text
    # cell is quoted
    text_cells = (v for col in out.columns if out[col].dtype.kind == "O" for v in out[col])
    quote_all = any(isinstance(v, str) and "\r" in v for v in text_cells)
    return str(out.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC if quote_all else None))

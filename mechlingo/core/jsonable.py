"""Values made ready for strict JSON (the ``summary.json`` files and saved artifacts)."""

from __future__ import annotations

import math
from typing import Any


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by ``None``, through dicts, lists
    and tuples (tuples become lists), so that ``json.dumps(..., allow_nan=False)`` accepts
    it. A missing number then reads as ``null``, never as the non-standard ``NaN``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj

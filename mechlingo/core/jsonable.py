"""Values made ready for strict JSON (the ``summary.json`` files, stage results, artifacts).

:func:`jsonable` is the one sanitiser every writer of JSON goes through: whatever a result
holds (numpy or torch scalars and arrays, tuples, sets, paths, result objects with a
``to_json`` method, dataclasses), it returns plain dicts, lists, strings, numbers, booleans
and ``None``, with every NaN or infinite float as ``None`` so that
``json.dumps(..., allow_nan=False)`` accepts it. A missing number then reads as ``null``,
never as the non-standard ``NaN`` or ``Infinity``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["jsonable"]


def jsonable(obj: Any) -> Any:
    """A JSON-ready copy of ``obj``.

    * ``float`` (also numpy/torch float scalars): itself when finite, else ``None``;
    * numpy/torch scalars: their Python value (``.item()``); arrays and tensors: nested
      lists (``.tolist()``), sanitised in turn;
    * mappings: dicts with string keys; lists, tuples, sets and frozensets: lists (a set
      sorted when its items can be sorted, so the output is stable);
    * paths (``os.PathLike``): their string;
    * an object with a ``to_json()`` method (an :class:`~mechlingo.kernels.significance.Interval`,
      a result class): its ``to_json()``, sanitised; any other dataclass instance: its
      fields as a dict;
    * ``str``, ``int``, ``bool``, ``None``: unchanged; anything else: unchanged (``json``
      then says what it cannot write).
    """
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        try:
            items = sorted(obj)
        except TypeError:
            items = list(obj)
        return [jsonable(v) for v in items]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if callable(getattr(obj, "to_json", None)) and not isinstance(obj, type):
        return jsonable(obj.to_json())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "tolist") and getattr(obj, "ndim", 0) > 0:  # an array or a tensor
        return jsonable(obj.tolist())
    if hasattr(obj, "item") and not isinstance(obj, (bytes, bytearray)):  # a 0-d scalar
        return jsonable(obj.item())
    return obj

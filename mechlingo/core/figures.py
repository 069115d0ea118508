"""How a result's ``fig_*`` method finds the function that draws it.

Results (in :mod:`mechlingo.analyses`) hold data; figures are drawn by :mod:`mechlingo.viz`,
a layer above them. So that ``lens_result.fig_heatmap()`` still works without the analysis
importing upward, each drawing function registers itself here under its own name
(:func:`drawer`), and a result's method calls :func:`draw` with that name. Importing
:mod:`mechlingo` (which any ``import mechlingo.…`` does first) imports :mod:`mechlingo.viz`,
so every figure is registered before a result can ask for one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from mechlingo.core.errors import MechlingoError

F = TypeVar("F", bound=Callable[..., Any])

_DRAWERS: dict[str, Callable[..., Any]] = {}


def drawer(fn: F) -> F:
    """Register ``fn`` as the drawing function named ``fn.__name__``."""
    _DRAWERS[fn.__name__] = fn
    return fn


def draw(name: str, *args: Any, **kwargs: Any) -> Any:
    """Draw figure ``name`` (a function of :mod:`mechlingo.viz`) with these arguments."""
    if name not in _DRAWERS:
        importlib.import_module("mechlingo.viz")  # registers all figures
    fn = _DRAWERS.get(name)
    if fn is None:
        raise MechlingoError(
            f"no figure named {name!r} is registered",
            fix=f"use one of {sorted(_DRAWERS)}",
        )
    return fn(*args, **kwargs)


def registered() -> list[str]:
    """The names of the registered figures (all of them once :mod:`mechlingo.viz` is
    loaded)."""
    return sorted(_DRAWERS)

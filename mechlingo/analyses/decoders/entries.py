"""Lens entries: the residual stream after ``l`` blocks, and the hooks that hold it.

Entry 0 is the embedding (``blocks.0.hook_resid_pre``), entry ``l < n`` is
``blocks.l.hook_resid_pre`` and entry ``n`` is the final ``blocks.{n-1}.hook_resid_post``,
which reproduces the model's own output. Every decoder (logit lens, tuned lens, patchscope)
reads the same entries, so their results line up layer by layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mechlingo.core.errors import InputError
from mechlingo.core.sites import hook_name, site_map
from mechlingo.core.types import Model

__all__ = ["lens_hook_names", "resolve_entries"]


def lens_hook_names(model: Model, layers: Sequence[int]) -> list[str]:
    """Hook names of lens entries (``l`` = residual stream after ``l`` blocks)."""
    n = site_map(model).n_layers
    names = []
    for entry in layers:
        if entry < n:
            names.append(hook_name(model, "resid_pre", entry))
        else:
            names.append(hook_name(model, "resid_post", n - 1))
    return names


def resolve_entries(model: Model, layers: Any) -> list[int]:
    """Normalise an entry selection (``None`` = all ``0..n``, an int or a list; negatives
    count from the end, ``-1`` = the output entry) to sorted distinct entries.

    Raises:
        InputError: an entry out of ``0..n`` or an empty selection.
    """
    n = site_map(model).n_layers
    if layers is None:
        return list(range(n + 1))
    out = []
    for entry in [layers] if isinstance(layers, int) else layers:
        e = int(entry) + n + 1 if int(entry) < 0 else int(entry)
        if not 0 <= e <= n:
            raise InputError(
                f"lens entry {entry} is out of range: entries are 0..{n} (0 = embeddings, "
                f"{n} = final output)"
            )
        out.append(e)
    if not out:
        raise InputError("the layer selection is empty")
    return sorted(set(out))

"""The error of the patching analyses."""

from __future__ import annotations

from mechlingo.core.errors import MechlingoError

__all__ = ["PatchingError"]


class PatchingError(MechlingoError, ValueError):
    """Bad input to activation patching (shapes, positions, alignment, sites)."""

"""Figures (plotly) drawn from analysis results; importing this package registers them
with :mod:`mechlingo.core.figures`, so ``result.fig_*()`` methods find them."""

from mechlingo.viz import common, experts, lenses, pipeline, repair, side_effects

__all__ = ["common", "experts", "lenses", "pipeline", "repair", "side_effects"]

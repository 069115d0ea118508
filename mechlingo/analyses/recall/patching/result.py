"""The result of activation patching, and the one bootstrap every patching result uses.

The *normalised effect* of a cell is ``(patched - corrupted) / (clean - corrupted)`` on the
mean over examples: 0 = the patch does nothing, 1 = it restores the source run's value.
Per-example values are kept, and bootstrap 95% intervals resample examples
(:func:`bootstrap_interval`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.core.defaults import SEED
from mechlingo.viz.common import html_summary, interval_text
from mechlingo.viz.patching import CircuitOptions, circuit_figure, patching_heatmaps

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = [
    "Cell",
    "PatchingBaselines",
    "PatchingResult",
    "bootstrap_interval",
    "normalized_effect",
    "readout_index",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True)
class Cell:
    """One patched place: site, layer, position label (index into the position axis) and
    head (``-1`` for whole-site patches)."""

    site: str
    layer: int
    position: int
    head: int = -1


def readout_index(names: Sequence[str], readout: str | int = 0) -> int:
    """Position of ``readout`` (a name or an index) among a result's readout ``names``."""
    if isinstance(readout, int):
        return readout
    if readout not in names:
        raise KeyError(f"unknown readout {readout!r}; pass one of {list(names)}")
    return list(names).index(readout)


def normalized_effect(v: Tensor, clean: Tensor, corrupted: Tensor) -> Tensor:
    """``(v - corrupted) / (clean - corrupted)``; NaN where clean equals corrupted."""
    denom = clean - corrupted
    denom = torch.where(denom.abs() < 1e-12, torch.full_like(denom, float("nan")), denom)
    return (v - corrupted) / denom


def bootstrap_interval(
    statistic: Callable[[Int[Tensor, "boot example"]], Float[Tensor, "... boot"]],
    n: int,
    *,
    n_boot: int = 1000,
    seed: int = SEED,
    level: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """Percentile bootstrap interval over ``n`` examples, vectorised over everything else.

    ``statistic(idx)`` gets ``n_boot`` resamples of example indices (``[boot, n]``, drawn
    with replacement from a generator seeded with ``seed``) and returns the statistic of
    each resample on the last axis (``[..., boot]``, e.g. one row per cell). Resamples whose
    statistic is NaN (a resample where clean equals corrupted) are skipped.

    Why not :mod:`mechlingo.kernels.significance`: its intervals (``scipy.stats.bootstrap``)
    are for one statistic of 1-D samples, where NaN poisons the interval; here one call covers
    every cell of a grid (a ratio of means of paired ``[cell, example]`` arrays) from the
    same resamples, in one tensor operation.
    """
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (n_boot, n), generator=g)
    stat = statistic(idx)
    a = (1 - level) / 2
    lo_hi = torch.nanquantile(stat, torch.tensor([a, 1 - a]), dim=-1)
    return lo_hi[0], lo_hi[1]


@dataclass
class PatchingBaselines:
    """What every patching result holds besides its values: the readouts, their measured
    baselines and the grid's layer and position axes (exact patching's
    :class:`PatchingResult` and attribution patching's
    :class:`~mechlingo.analyses.recall.attribution.NeuronAttribution`).

    Attributes:
        readout_names: names of the readouts, what each patched run is read out as (first
            axis of the values and baselines).
        clean: ``[readout, example]`` readout of the source ("clean") run.
        corrupted: ``[readout, example]`` readout of the unpatched target ("corrupted") run.
        layers: the grid's layers.
        position_labels: label of each position of the grid (``"-1"`` = last token, ...).
    """

    readout_names: list[str]
    clean: Float[Tensor, "readout example"]
    corrupted: Float[Tensor, "readout example"]
    layers: list[int]
    position_labels: list[str]

    def readout_index(self, readout: str | int = 0) -> int:
        """Position of ``readout`` (a name or an index) among :attr:`readout_names`."""
        return readout_index(self.readout_names, readout)


@dataclass
class PatchingResult(PatchingBaselines):
    """The result of :func:`patch_activations`: the baselines and axes of
    :class:`PatchingBaselines`, and

    Attributes:
        cells: the patched cells, in the order of ``values``' cell axis.
        values: ``[readout, cell, example]`` readout of each patched target run.
        sites, heads: the grid's other axes (``heads`` empty without head sites).
        target_positions, source_positions: ``[position, example]`` resolved token positions.
        alignment: how positions were aligned (``"same"``, ``"last"``, ``"subject"``, ``"map"``).
    """

    cells: list[Cell]
    values: Float[Tensor, "readout cell example"]
    sites: list[str]
    heads: list[int]
    target_positions: Int[Tensor, "position example"]
    source_positions: Int[Tensor, "position example"]
    alignment: str
    meta: dict[str, Any] = field(default_factory=dict)

    def mean(self, readout: str | int = 0) -> Float[Tensor, " cell"]:
        """Mean over examples of the patched readout per cell."""
        return self.values[self.readout_index(readout)].mean(-1)

    def effect(self, readout: str | int = 0) -> Float[Tensor, " cell"]:
        """Mean of (patched - corrupted) per cell, in the readout's units."""
        m = self.readout_index(readout)
        return (self.values[m] - self.corrupted[m]).mean(-1)

    def normalized(self, readout: str | int = 0) -> Float[Tensor, " cell"]:
        """``(patched - corrupted) / (clean - corrupted)`` on the means over examples:
        0 = no effect, 1 = restores the source run (NaN when clean == corrupted)."""
        m = self.readout_index(readout)
        return normalized_effect(
            self.values[m].mean(-1), self.clean[m].mean(), self.corrupted[m].mean()
        )

    def bootstrap_ci(
        self,
        readout: str | int = 0,
        *,
        normalized: bool = True,
        n_boot: int = 1000,
        seed: int = SEED,
        level: float = 0.95,
    ) -> tuple[Float[Tensor, " cell"], Float[Tensor, " cell"]]:
        """Bootstrap interval (resampling examples) of :meth:`normalized` or
        :meth:`effect` per cell."""
        m = self.readout_index(readout)
        v, c, k = self.values[m], self.clean[m], self.corrupted[m]

        def stat(idx: Tensor) -> Tensor:  # [cell, boot]
            vb, cb, kb = v[:, idx].mean(-1), c[idx].mean(-1), k[idx].mean(-1)
            return normalized_effect(vb, cb, kb) if normalized else vb - kb

        n = self.values.shape[-1]
        return bootstrap_interval(stat, n, n_boot=n_boot, seed=seed, level=level)

    def grid(
        self, site: str, readout: str | int = 0, value: str = "normalized"
    ) -> Float[Tensor, "layer position ..."]:
        """The ``[layer, position]`` (heads: ``[layer, position, head]``) grid of one site:
        ``value`` is ``"normalized"``, ``"effect"`` or ``"mean"``; NaN where not swept."""
        fn = {"normalized": self.normalized, "effect": self.effect, "mean": self.mean}[value]
        vals = fn(readout)
        shape = [len(self.layers), len(self.position_labels)]
        if site == "head":
            shape.append(max(1, len(self.heads)))
        out = torch.full(shape, float("nan"))
        li = {layer: i for i, layer in enumerate(self.layers)}
        hi = {h: i for i, h in enumerate(self.heads)}
        for c, cell in enumerate(self.cells):
            if cell.site != site:
                continue
            key = (li[cell.layer], cell.position) + ((hi[cell.head],) if site == "head" else ())
            out[key] = vals[c]
        return out

    def top_cells(self, k: int = 10, readout: str | int = 0) -> list[dict[str, Any]]:
        """The ``k`` cells with the largest absolute normalised effect."""
        vals = self.normalized(readout)
        order = torch.argsort(torch.nan_to_num(vals.abs(), nan=-1.0), descending=True)[:k]
        return [
            {**self.cell_dict(self.cells[int(i)]), "normalized": float(vals[int(i)])} for i in order
        ]

    def cell_dict(self, cell: Cell) -> dict[str, Any]:
        """A cell as a table row: site, layer, position label, head (``None``: whole site)."""
        return {
            "site": cell.site,
            "layer": cell.layer,
            "position": self.position_labels[cell.position],
            "head": cell.head if cell.head >= 0 else None,
        }

    def to_dataframe(self, *, per_example: bool = False) -> pd.DataFrame:
        """One row per (readout, cell): mean, effect, normalised effect and its 95% bootstrap
        interval; with ``per_example`` one row per (readout, cell, example) instead."""
        import pandas as pd

        rows = []
        for m, name in enumerate(self.readout_names):
            if per_example:
                v = self.values[m].tolist()
                for c, cell in enumerate(self.cells):
                    for e, x in enumerate(v[c]):
                        rows.append(
                            {
                                "readout": name,
                                **self.cell_dict(cell),
                                "example": e,
                                "patched": x,
                                "clean": float(self.clean[m, e]),
                                "corrupted": float(self.corrupted[m, e]),
                            }
                        )
                continue
            mean, eff, nrm = self.mean(m), self.effect(m), self.normalized(m)
            lo, hi = self.bootstrap_ci(m)
            for c, cell in enumerate(self.cells):
                rows.append(
                    {
                        "readout": name,
                        **self.cell_dict(cell),
                        "mean": float(mean[c]),
                        "effect": float(eff[c]),
                        "normalized": float(nrm[c]),
                        "ci_low": float(lo[c]),
                        "ci_high": float(hi[c]),
                    }
                )
        return pd.DataFrame(rows)

    def summary(self) -> dict[str, Any]:
        """Baselines per readout and the top cells of the first readout (JSON-ready)."""
        return {
            "readouts": {
                name: {
                    "clean": float(self.clean[m].mean()),
                    "corrupted": float(self.corrupted[m].mean()),
                }
                for m, name in enumerate(self.readout_names)
            },
            "alignment": self.alignment,
            "n_examples": int(self.values.shape[-1]),
            "n_cells": len(self.cells),
            "top_cells": self.top_cells(10),
            **self.meta,
        }

    def __repr__(self) -> str:
        return (
            f"PatchingResult({len(self.cells)} cells over sites {self.sites}, layers "
            f"{self.layers[0]}..{self.layers[-1]}, {self.values.shape[-1]} examples, "
            f"{self.alignment} alignment, readouts {self.readout_names})"
        )

    def _repr_html_(self) -> str:
        """Per readout the clean and corrupted means; the top cells of the first readout with
        their normalised effect and its 95% bootstrap interval."""
        n = int(self.values.shape[-1])
        rows: list[dict[str, Any]] = [
            {"readout": name, "clean": float(self.clean[m].mean()),
             "corrupted": float(self.corrupted[m].mean()), "n": n}
            for m, name in enumerate(self.readout_names)
        ]  # fmt: skip
        vals = self.normalized(0)
        lo, hi = self.bootstrap_ci(0, n_boot=400)
        order = torch.argsort(torch.nan_to_num(vals.abs(), nan=-1.0), descending=True)[:8]
        top = [
            {**self.cell_dict(self.cells[int(i)]),
             "normalised effect [95% CI]": interval_text(float(vals[i]), float(lo[i]),
                                                         float(hi[i])), "n": n}
            for i in order
        ]  # fmt: skip
        return html_summary(repr(self), rows) + html_summary(
            f"top cells by |normalised effect| on {self.readout_names[0]}", top
        )

    def fig_heatmap(self, readout: str | int = 0, value: str = "normalized") -> go.Figure:
        """Layer-by-position heatmaps, one panel per site (heads: averaged over positions as a
        layer-by-head panel)."""

        m = self.readout_index(readout)
        return patching_heatmaps(
            {s: self.grid(s, m, value) for s in self.sites},
            layers=self.layers,
            position_labels=self.position_labels,
            heads=self.heads,
            readout_name=self.readout_names[m],
            alignment=self.alignment,
            value=value,
            n_examples=int(self.values.shape[-1]),
        )

    def fig_circuit(self, readout: str | int = 0, **options: Unpack[CircuitOptions]) -> go.Figure:
        """The circuit diagram: the ``top_k`` cells by absolute normalised effect on a
        token-position x layer grid, joined along the residual stream and by attention,
        over the ``phases`` layer bands (``options``: ``top_k``, ``phases``,
        ``token_labels``, ``title``, ``heads``, ``verified``, as
        :func:`mechlingo.viz.patching.circuit_figure` takes them)."""
        m = self.readout_index(readout)
        options.setdefault("n_examples", int(self.values.shape[-1]))
        return circuit_figure(
            [(c.site, c.layer, c.position, c.head) for c in self.cells],
            self.normalized(m),
            layers=self.layers,
            position_labels=self.position_labels,
            readout_name=self.readout_names[m],
            **options,
        )

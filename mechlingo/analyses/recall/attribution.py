"""Attribution patching (AtP): every cell of a patching grid from one forward and one
backward pass, ``readout(patched) ~= readout(target) + (a_source - a_target) . d readout / d a``.

* :func:`attribution_patch` takes the arguments of
  :func:`mechlingo.analyses.recall.patching.patch_activations` (resolved by the same code,
  :mod:`mechlingo.analyses.recall.patching.grid`) and returns the same
  :class:`~mechlingo.analyses.recall.patching.PatchingResult`, whose ``values`` are the
  *estimated* patched readout and ``clean``/``corrupted`` the measured baselines;
* :func:`neuron_attribution`: the same estimate for every MLP neuron (``mlp_post``);
* :func:`verify_top_cells` and :func:`compare_patching`: the top cells patched exactly, and
  the agreement with exact patching (verify the cells you report).

The AtP* QK fix is on by default for ``resid_pre`` cells (``qk_fix=True``); GradDrop is not
implemented. The method, its accuracy and its cost: ``docs/methods/recall-pipeline.md``. The
gradient passes are :mod:`mechlingo.analyses.recall.gradients`."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict, Unpack

import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.analyses.recall.gradients import (
    Grads,
    check_interpolable,
    gradient_pass,
    patched_patterns,
)
from mechlingo.analyses.recall.patching import (
    AnswerReadout,
    Cell,
    PatchingError,
    PatchingResult,
    PositionLabel,
    patch_activations,
)
from mechlingo.analyses.recall.patching.grid import (
    GridArgs,
    PatchingSetup,
    SiteGridArgs,
    check_sites,
    resolve_grid,
)
from mechlingo.analyses.recall.patching.result import PatchingBaselines
from mechlingo.core.sites import resolve_site
from mechlingo.core.types import Model

if TYPE_CHECKING:
    import pandas as pd

#: Interpolation steps of ``method="ig"`` by default, chosen on dev prompts
#: (``benchmarks/bench_attribution.py``; see ``docs/methods/recall-pipeline.md``).
IG_STEPS = 2

__all__ = [
    "NeuronAttribution",
    "attribution_patch",
    "compare_patching",
    "neuron_attribution",
    "verify_top_cells",
]


# --------------------------------------------------------------------------------------
# Attribution patching
# --------------------------------------------------------------------------------------


def _estimates(
    setup: PatchingSetup,
    g: Grads,
    name: str,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """``(estimate [readout, row, position(, head)], delta [row, position, ...])`` of one
    hook: (scaled source - target activation) . gradient at each aligned position."""
    B = setup.tgt.batch_size
    rows = torch.arange(B)[:, None]
    t_pos = setup.pos.target.T.to(torch.long)  # [row, position]
    tgt = g.acts[name][rows, t_pos]  # [row, P, ...]
    grad = g.grads[name][:, rows, t_pos]  # [readout, row, P, ...]
    delta = scale * (g.src_acts[name].to(tgt.device) - tgt)
    return (grad * delta).sum(-1), delta


def _hook_estimates(
    model: Model,
    setup: PatchingSetup,
    g: Grads,
    names: Mapping[tuple[str, int], str],
    scale: float,
    qk_fix: bool,
) -> dict[str, Tensor]:
    """The estimate ``[readout, row, position(, head)]`` of every hook of the grid, with the
    QK fix applied to the ``resid_pre`` hooks when ``qk_fix``."""
    per_hook: dict[str, Tensor] = {}
    deltas: dict[int, Tensor] = {}
    for (s, layer), name in names.items():
        per_hook[name], delta = _estimates(setup, g, name, scale)
        if s == "resid_pre" and qk_fix:
            deltas[layer] = delta
    if deltas:
        for layer, corr in _qk_corrections(model, setup, g, deltas).items():
            name = names[("resid_pre", layer)]
            per_hook[name] = per_hook[name] + corr
    return {k: v.cpu() for k, v in per_hook.items()}


def _cell_values(
    cells: Sequence[Cell],
    per_hook: Mapping[str, Tensor],
    names: Mapping[tuple[str, int], str],
    corrupted: Tensor,
) -> Float[Tensor, "readout cell row"]:
    """``corrupted + estimate`` of every cell."""
    values = []
    for c in cells:
        est = per_hook[names[(c.site, c.layer)]]  # [readout, row, P(, head)]
        values.append(
            corrupted + (est[:, :, c.position, c.head] if c.head >= 0 else est[:, :, c.position])
        )
    if not values:
        return torch.empty(corrupted.shape[0], 0, corrupted.shape[1])
    return torch.stack(values, dim=1)


def attribution_patch(
    model: Model,
    source: Any,
    target: Any,
    sites: Sequence[str] | str = ("resid_pre",),
    *,
    method: Literal["atp", "ig"] = "atp",
    steps: int = IG_STEPS,
    qk_fix: bool | None = None,
    scale: float = 1.0,
    **grid: Unpack[SiteGridArgs],
) -> PatchingResult:
    """Estimate a whole :func:`~mechlingo.analyses.recall.patching.patch_activations` grid by
    attribution patching; the sites and grid keywords are those of ``patch_activations``, plus:

    Args:
        method: ``"atp"`` (default): the gradient of the target run. ``"ig"``: integrated
            gradients from the target's input embeddings to the source's (EAP-IG, Hanna et
            al. 2024; the left Riemann sum over ``steps``, ``steps=1`` is plain AtP), in one
            pass of ``steps`` copies; needs source and target rows of equal token length.
        steps: interpolation steps of ``method="ig"`` (the default was chosen on dev prompts,
            ``docs/methods/recall-pipeline.md``).
        qk_fix: apply AtP*'s QK fix to ``resid_pre`` cells (``docs/methods/recall-pipeline.md``);
            default on for ``"atp"``; not available with ``"ig"``.
        scale: patch ``target + scale * (source - target)`` instead of the source activation
            (``1`` = a full patch; a small value gives the first-order regime, where the
            estimate must equal exact patching of the same interpolation).

    Returns:
        A :class:`~mechlingo.analyses.recall.patching.PatchingResult` whose ``values`` are the
        *estimated* patched readouts (``corrupted + estimate``, per example) and whose
        ``clean``/``corrupted`` are the measured baselines; ``meta["method"]`` is ``"atp"``
        (``"atp*"`` when the QK fix changed some cell) or ``"ig"`` (with ``meta["steps"]``),
        and ``meta["seconds"]`` the wall time.

    Raises:
        PatchingError: the input errors of ``patch_activations``; an unknown ``method``, ``steps <
            1``, ``qk_fix=True`` with ``"ig"``, or ``"ig"`` on rows of unequal length.
    """
    t0 = time.perf_counter()
    alphas = _alphas(method, steps, qk_fix)
    setup = resolve_grid(model, source, target, check_sites(sites), **grid)
    names = setup.hook_names(model)
    if method == "ig":
        check_interpolable(model, setup.src, setup.tgt)
    qk_on = method == "atp" and qk_fix is not False
    qk_layers = setup.layers if (qk_on and "resid_pre" in setup.sites) else []
    g = gradient_pass(model, setup, list(dict.fromkeys(names.values())), qk_layers, alphas)
    per_hook = _hook_estimates(model, setup, g, names, scale, bool(qk_layers))
    cells = setup.cells()
    corrupted = g.corrupted.cpu()
    meta = {
        "method": "ig" if method == "ig" else ("atp*" if qk_layers else "atp"),
        "steps": len(alphas),
        "qk_fix": bool(qk_layers),
        "scale": float(scale),
        "seconds": round(time.perf_counter() - t0, 4),
    }
    return setup.result(
        cells, _cell_values(cells, per_hook, names, corrupted), g.clean, corrupted, meta
    )


def _alphas(method: str, steps: int, qk_fix: bool | None) -> list[float]:
    """The interpolation points of ``method`` (``[0.0]`` for plain AtP), checked."""
    if method not in ("atp", "ig"):
        raise PatchingError(f"method must be 'atp' or 'ig', got {method!r}")
    if method == "atp":
        return [0.0]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PatchingError(f"steps must be an integer >= 1, got {steps!r}")
    if qk_fix:
        raise PatchingError(
            "the QK fix corrects the target run's gradient and does not combine with "
            "method='ig'; pass qk_fix=None (or False)"
        )
    return [j / steps for j in range(steps)]


def _qk_corrections(
    model: Model, setup: PatchingSetup, g: Grads, deltas: Mapping[int, Tensor]
) -> dict[int, Float[Tensor, "readout row position"]]:
    """AtP*'s QK fix for the ``resid_pre`` cells of each layer in ``deltas`` (``{layer:
    [row, position, d_model] patch}``): minus the linear estimate of the path through that
    layer's attention pattern, plus the exact pattern change times the pattern gradient. The
    exact pattern changes of all layers come from one partial pass per example."""
    layers = sorted(deltas)
    t_pos = setup.pos.target.T.to(torch.long)
    B = t_pos.shape[0]
    rows = torch.arange(B)[:, None]
    out: dict[int, Tensor] = {}
    for layer in layers:
        linear_qk = (g.qk_grads[layer][:, rows, t_pos] * deltas[layer]).sum(-1)  # [m, row, P]
        out[layer] = -linear_qk
    names = {layer: resolve_site(model, "resid_pre", layer).hook_name for layer in layers}
    for b in range(B):
        one = setup.tgt.select([b])
        n = int(one.lengths[0])
        vals = {  # the patched residual rows [P, d_model] of each layer
            layer: g.acts[names[layer]][b, t_pos[b]] + deltas[layer][b] for layer in layers
        }
        d_a = patched_patterns(model, one, layers, t_pos[b], vals)
        for layer in layers:
            g_a = g.pattern_grads[layer][:, b, :, :n, :n]  # [readout, head, q, k]
            exact = torch.einsum("mhqk,phqk->mp", g_a, d_a[layer].to(g_a.device))
            out[layer][:, b] += exact.to(out[layer].device)
    return out


# --------------------------------------------------------------------------------------
# MLP neurons
# --------------------------------------------------------------------------------------


@dataclass
class NeuronAttribution(PatchingBaselines):
    """Attribution-patching estimates for every MLP neuron (``mlp_post``) of a grid: the
    measured baselines and axes of
    :class:`~mechlingo.analyses.recall.patching.result.PatchingBaselines`, and

    Attributes:
        values: ``[readout, layer, position, neuron, example]`` estimated change of the readout
            when that one neuron of the target run takes its source value (first order).
    """

    values: Float[Tensor, "readout layer position neuron example"]
    meta: dict[str, Any] = field(default_factory=dict)

    def effect(self, readout: str | int = 0) -> Float[Tensor, "layer position neuron"]:
        """Mean estimated change of the readout over examples, in the readout's units."""
        return self.values[self.readout_index(readout)].mean(-1)

    def normalized(self, readout: str | int = 0) -> Float[Tensor, "layer position neuron"]:
        """:meth:`effect` divided by ``clean - corrupted`` (the mean gap): the share of the
        gap that patching this neuron alone is estimated to close."""
        m = self.readout_index(readout)
        gap = float((self.clean[m] - self.corrupted[m]).mean())
        return self.effect(m) / (gap if abs(gap) > 1e-12 else float("nan"))

    def top(self, k: int = 20, readout: str | int = 0) -> list[dict[str, Any]]:
        """The ``k`` neurons with the largest absolute mean estimated effect."""
        eff = self.effect(readout)
        nrm = self.normalized(readout)
        flat = torch.nan_to_num(eff.abs(), nan=-1.0).flatten()
        idx = torch.argsort(flat, descending=True)[:k]
        L, P, N = eff.shape
        out = []
        for i in idx.tolist():
            li, p, n = i // (P * N), (i // N) % P, i % N
            out.append(
                {
                    "layer": self.layers[li],
                    "position": self.position_labels[p],
                    "neuron": n,
                    "effect": float(eff[li, p, n]),
                    "normalized": float(nrm[li, p, n]),
                }
            )
        return out

    def to_dataframe(self, k: int = 100, readout: str | int = 0) -> pd.DataFrame:
        """The top ``k`` neurons (see :meth:`top`) as a table."""
        import pandas as pd

        name = self.readout_names[self.readout_index(readout)]
        return pd.DataFrame([{"readout": name, **r} for r in self.top(k, readout)])


def neuron_attribution(
    model: Model,
    source: Any,
    target: Any,
    *,
    method: Literal["atp", "ig"] = "atp",
    steps: int = IG_STEPS,
    **grid: Unpack[GridArgs],
) -> NeuronAttribution:
    """Attribution patching of every MLP neuron (``mlp_post``) at every layer and position:
    ``(a_source - a_target) * d readout / d a`` per neuron, with the inputs, positions and
    readouts of :func:`attribution_patch` / ``patch_activations`` (the grid keywords of
    :class:`~mechlingo.analyses.recall.patching.grid.GridArgs`: no sites, so no ``heads``).
    ``method``/``steps`` as there (``"ig"``: the gradient averaged along the input
    interpolation; no QK fix: neurons feed no softmax directly)."""
    t0 = time.perf_counter()
    alphas = _alphas(method, steps, None)
    setup = resolve_grid(model, source, target, [], **grid)
    if method == "ig":
        check_interpolable(model, setup.src, setup.tgt)
    names = {layer: resolve_site(model, "mlp_post", layer).hook_name for layer in setup.layers}
    B = setup.tgt.batch_size
    g = gradient_pass(model, setup, list(names.values()), alphas=alphas)
    per_layer = []
    rows = torch.arange(B)[:, None]
    t_pos = setup.pos.target.T.to(torch.long)
    for name in names.values():
        tgt = g.acts[name][rows, t_pos]  # [row, P, neuron]
        delta = g.src_acts[name].to(tgt.device) - tgt
        per_layer.append((g.grads[name][:, rows, t_pos] * delta).cpu())  # [readout, row, P, N]
    vals = torch.stack(per_layer, dim=1).permute(0, 1, 3, 4, 2).contiguous()
    return NeuronAttribution(
        values=vals,
        clean=g.clean,
        corrupted=g.corrupted,
        readout_names=[m.name for m in setup.readouts],
        layers=setup.layers,
        position_labels=setup.pos.labels,
        meta={
            "method": method,
            "steps": len(alphas),
            "seconds": round(time.perf_counter() - t0, 4),
        },
    )


# --------------------------------------------------------------------------------------
# Checking estimates against exact patching
# --------------------------------------------------------------------------------------


def compare_patching(
    approx: PatchingResult, exact: PatchingResult, *, readout: str | int = 0, k: int = 10
) -> dict[str, dict[str, float | int]]:
    """Agreement of an attribution estimate with exact patching, per site and over all cells.

    Compared per cell: the mean effect over examples (``patched - corrupted``). For each site
    (and ``"all"``): ``spearman`` (rank correlation), ``pearson``, ``top_k`` (share of the
    ``k`` cells with the largest absolute exact effect that are also among the ``k`` largest
    estimates; 1 = the same top cells) and ``n_cells``. Cells present in only one result are
    ignored.
    """
    from scipy.stats import pearsonr, spearmanr

    a_eff = approx.effect(approx.readout_index(readout))
    e_eff = exact.effect(exact.readout_index(readout))
    index = {c: i for i, c in enumerate(exact.cells)}
    pairs: dict[str, list[tuple[float, float]]] = {}
    for i, c in enumerate(approx.cells):
        j = index.get(c)
        if j is None:
            continue
        x, y = float(a_eff[i]), float(e_eff[j])
        if math.isfinite(x) and math.isfinite(y):
            pairs.setdefault(c.site, []).append((x, y))
    if len(pairs) > 1:
        pairs["all"] = [p for v in list(pairs.values()) for p in v]
    out: dict[str, dict[str, float | int]] = {}
    for site, xy in pairs.items():
        x = torch.tensor([p[0] for p in xy])
        y = torch.tensor([p[1] for p in xy])
        kk = min(k, len(xy))
        top_a = set(torch.argsort(x.abs(), descending=True)[:kk].tolist())
        top_e = set(torch.argsort(y.abs(), descending=True)[:kk].tolist())
        const = len(xy) < 3 or float(x.std()) == 0 or float(y.std()) == 0
        out[site] = {
            "spearman": float("nan") if const else float(spearmanr(x, y).statistic),
            "pearson": float("nan") if const else float(pearsonr(x, y).statistic),
            "top_k": len(top_a & top_e) / kk if kk else float("nan"),
            "k": kk,
            "n_cells": len(xy),
        }
    return out


class VerifyArgs(TypedDict, total=False):
    """The keywords :func:`verify_top_cells` passes on to
    :func:`~mechlingo.analyses.recall.patching.patch_activations` (the grid's ``layers`` and
    ``heads`` are the top cells'; ``positions`` is a parameter of its own)."""

    readout: AnswerReadout | Sequence[AnswerReadout] | None
    alignment: str | Mapping[int, int] | None
    source_subject: Sequence[tuple[int, int]] | None
    target_subject: Sequence[tuple[int, int]] | None
    cells_per_batch: int | None
    batching: Literal["grow", "stack"]
    reuse_prefix: bool | None
    progress: bool


def verify_top_cells(
    model: Model,
    source: Any,
    target: Any,
    approx: PatchingResult,
    *,
    site: str = "head",
    k: int = 5,
    by: str | int = 0,
    positions: Sequence[PositionLabel] | None = None,
    **patch_kwargs: Unpack[VerifyArgs],
) -> list[dict[str, Any]]:
    """Patch the ``k`` cells of ``site`` with the largest absolute estimated effect exactly.

    Runs :func:`~mechlingo.analyses.recall.patching.patch_activations` on the smallest grid holding those cells
    (their layers x the grid's positions x their heads) with the same source, target,
    ``positions`` (the position specs the estimate was made with) and ``patch_kwargs``
    (``readout=``, ``alignment=``, ...), and returns, per top cell (ranked by the readout
    ``by``), its ``estimate`` and its ``exact`` normalised effect (and the effects in readout
    units).
    """
    m = approx.readout_index(by)
    nrm, eff = approx.normalized(m), approx.effect(m)
    idx = [i for i, c in enumerate(approx.cells) if c.site == site]
    if not idx:
        raise PatchingError(f"the result has no {site!r} cells to verify")
    idx.sort(key=lambda i: -abs(float(torch.nan_to_num(eff[i], nan=0.0))))
    top = [approx.cells[i] for i in idx[:k]]
    layers = sorted({c.layer for c in top})
    heads = sorted({c.head for c in top}) if site == "head" else None
    exact = patch_activations(
        model, source, target, site, layers=layers, positions=positions, heads=heads, **patch_kwargs
    )
    if exact.position_labels != approx.position_labels:
        raise PatchingError(
            f"the exact grid's positions {exact.position_labels} differ from the estimate's "
            f"{approx.position_labels}: pass the same positions="
        )
    e_nrm, e_eff = exact.normalized(m), exact.effect(m)
    where = {c: j for j, c in enumerate(exact.cells)}
    pos_of = {c: i for i, c in enumerate(approx.cells)}
    out = []
    for c in top:
        i, j = pos_of[c], where[c]
        out.append(
            {
                **approx.cell_dict(c),
                "estimate": float(nrm[i]),
                "exact": float(e_nrm[j]),
                "estimate_effect": float(eff[i]),
                "exact_effect": float(e_eff[j]),
            }
        )
    return out

"""The planner's CPU estimate against the CPU a card then used, per stage and for the run.

A card's ``claims.json`` stores what the planner estimated before the run
(``meta.plan.seconds.stages``: each stage's CPU seconds from its cost model) and what each
stage then used (``meta.stages[name].cpu_seconds``: ``time.process_time`` of the process
that wrote the card; under torchrun one process's, as the estimate is). :func:`cost_check`
reads them and gives each stage's and the whole run's ratio estimate / used, flagging any
outside :data:`BAND`. With ``recompute`` it also gives what today's cost models would
estimate from the inputs the planner stored (the settings, the data's sizes, the measured
per-item seconds), so a card run on older models checks the current ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mechlingo.card.stages import CardSettings, estimate_seconds
from mechlingo.card.stages.circuits import plan_sizes
from mechlingo.core.errors import InputError
from mechlingo.core.untrusted import read_json

__all__ = ["BAND", "CostCheck", "CostRatio", "cost_check"]

#: The band the ratio estimate / used must fall in (the planner's goal: within 30%).
BAND = (0.7, 1.3)
#: Stages that used less CPU than this are not judged (a skipped stage, a stage with no
#: data: their ratio is noise).
MIN_USED = 1.0


@dataclass(frozen=True)
class CostRatio:
    """One stage's (or the run's) ``estimate`` and ``used`` CPU seconds, their ``ratio``
    (``None``: not judged, ``why``) and ``outside``: the ratio lies outside :data:`BAND`."""

    name: str
    estimate: float
    used: float
    ratio: float | None
    outside: bool
    why: str = ""


@dataclass
class CostCheck:
    """The ratios of a card: ``stages`` (in the card's order), ``card`` (the judged stages
    summed) and ``flagged`` (the names outside the band, ``"card"`` for the run)."""

    stages: list[CostRatio]
    card: CostRatio
    band: tuple[float, float] = BAND
    processes: int = 1
    source: str = "stored"
    notes: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> list[str]:
        """The stages (and ``"card"``) whose ratio lies outside the band."""
        return [r.name for r in [*self.stages, self.card] if r.outside]

    def to_json(self) -> dict[str, Any]:
        """JSON: every ratio, the band, the processes and which estimate was read."""
        return {"stages": [asdict(r) for r in self.stages], "card": asdict(self.card),
                "band": list(self.band), "processes": self.processes, "source": self.source,
                "flagged": self.flagged, "notes": self.notes}  # fmt: skip

    def __str__(self) -> str:
        lo, hi = self.band
        lines = [f"CPU estimate / used ({self.source} estimate, {self.processes} process(es); "
                 f"band {lo:g} to {hi:g})"]  # fmt: skip
        for r in [*self.stages, self.card]:
            ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
            flag = "  OUTSIDE" if r.outside else (f"  ({r.why})" if r.why else "")
            lines.append(f"  {r.name:<18} {r.estimate:>8.1f} / {r.used:>8.1f}  {ratio:>5}{flag}")
        return "\n".join([*lines, *self.notes])


def _ratio(
    name: str, est: float, used: float, band: tuple[float, float], why: str = ""
) -> CostRatio:
    if why:
        return CostRatio(name, est, used, None, False, why)
    if used < MIN_USED:
        return CostRatio(name, est, used, None, False, f"used under {MIN_USED:g} CPU-second")
    r = round(est / used, 3)
    return CostRatio(name, round(est, 1), round(used, 1), r, not band[0] <= r <= band[1])


def recomputed(claims: Mapping[str, Any], processes: int | None = None) -> dict[str, float]:
    """Each stage's estimate by today's cost models from the inputs the card's planner
    stored (``meta.settings``, ``meta.papers``, the plan's ``inputs.available`` and
    ``seconds.per_item``); ``processes`` replaces the stored process count (a card stored
    before the planner recorded it ran in one process unless said). A card stored before
    the planner recorded the circuits stage's pools and found rates gets them as its
    planner would have (:func:`~mechlingo.card.stages.circuits.plan_sizes`) when it read the
    bundled facts (``meta.facts_scope`` stored and ``None``) on a named ``meta.model``."""
    meta = claims["meta"]
    plan = meta["plan"]
    settings = CardSettings.of(meta["settings"])
    sizes = dict(plan["inputs"]["available"])
    if processes is not None:
        sizes["processes"] = int(processes)
    if "circuits" not in sizes and "facts_scope" in meta and meta["facts_scope"] is None:
        sizes["circuits"] = plan_sizes(None, settings, meta.get("model"))
    unit = dict(plan["seconds"]["per_item"])
    return estimate_seconds(settings, list(meta["papers"]), sizes, unit)


def cost_check(
    claims: Mapping[str, Any] | str | Path,
    *,
    recompute: bool = False,
    processes: int | None = None,
    band: tuple[float, float] = BAND,
) -> CostCheck:
    """Each stage's and the whole run's CPU estimate / used of a finished card
    (``claims``: its ``claims.json``, a path or the loaded mapping), flagging each ratio
    outside ``band`` (a ratio below 1: the planner under-estimated). A stage read from the
    stage cache, failed, or that used under :data:`MIN_USED` CPU-seconds is listed and not
    judged; the run's ratio sums the judged stages. ``recompute``: the estimate of today's
    cost models from the stored inputs (:func:`recomputed`, with ``processes``) instead of
    the stored one.

    Raises:
        InputError: a ``claims.json`` without the plan's stage estimates or the stages'
            timings (a card written before they were stored, or not a card).
    """
    doc = (
        read_json(claims, InputError, numbers=False) if isinstance(claims, (str, Path)) else claims
    )
    meta = doc.get("meta") if isinstance(doc, Mapping) else None
    try:
        timing = meta["stages"]  # type: ignore[index]
        stored = meta["plan"]["seconds"]["stages"]  # type: ignore[index]
    except (KeyError, TypeError):
        raise InputError("the claims.json holds no plan estimates or stage timings "
                         "(meta.plan.seconds.stages, meta.stages)",
                         fix="give the claims.json of a finished replicate run") from None  # fmt: skip
    n_proc = int(
        processes or meta["plan"].get("inputs", {}).get("available", {}).get("processes", 1)
    )
    est = recomputed(doc, n_proc) if recompute else dict(stored)
    rows: list[CostRatio] = []
    tot_e = tot_u = 0.0
    for name, t in timing.items():
        e, u = float(est.get(name, 0.0)), float(t.get("cpu_seconds") or 0.0)
        why = ("read from the stage cache" if t.get("cached") else
               "failed" if t.get("error") else "no estimate" if name not in est else "")  # fmt: skip
        r = _ratio(name, e, u, band, why)
        rows.append(r)
        if r.ratio is not None:
            tot_e, tot_u = tot_e + e, tot_u + u
    notes = [] if not recompute else [
        "estimate recomputed by today's cost models from the stored inputs"]  # fmt: skip
    return CostCheck(rows, _ratio("card", tot_e, tot_u, band), band, n_proc,
                     "recomputed" if recompute else "stored", notes)  # fmt: skip

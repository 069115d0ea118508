"""The conversion stage: corrupted-subject patching of ``mlp_out`` and ``attn_out`` at the last
token, at the layers of the tracer's "conversion to L" band against as many random sites
outside it, and its row (the restored log-probability of the L answer)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mechlingo.analyses.recall.patching import patch_activations
from mechlingo.analyses.recall.patching.readouts import fact_readouts
from mechlingo.card import claims as C
from mechlingo.card.claims import LU
from mechlingo.card.clustered_tests import mean_test, paired_test
from mechlingo.card.repair_items import cluster_note, item_clusters, subject_keys
from mechlingo.card.rules import make_row
from mechlingo.card.stages.base import (
    Budget,
    Context,
    ReportLike,
    Stage,
    check,
    data_section,
    processes,
)
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.data import Fact

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings


def conversion_band(trace: Mapping[str, Any], lang: str) -> list[int] | None:
    """The layers (blocks) of the tracer's "conversion to L" band: from the median first lens
    entry where the L answer is decodable, minus one, to the last block (as
    :func:`mechlingo.analyses.recall.trace_patching.pipeline_phases`); ``None`` when no L answer is."""
    firsts = [r["first_answer_layer"] for r in trace["records"]
              if r["lang"] == lang and r["first_answer_layer"] >= 0]  # fmt: skip
    if not firsts:
        return None
    n = int(trace["n_layers"])
    start = max(0, int(round(float(np.median(firsts)))) - 1)
    return list(range(min(start, n - 1), n))


def _pairs(facts: list[Fact], trace: Mapping[str, Any], lang: str, n: int) -> tuple[list, list]:
    """Up to ``n`` clean facts of ``lang`` (correct ones first) and a corrupted partner each."""
    ok = {r["id"] for r in trace["records"] if r["lang"] == lang and r["correct"]}
    pool = sorted((f for f in facts if f.lang == lang), key=lambda f: (f.id not in ok, f.id))
    clean = pool[:n]
    corrupt = []
    for k, f in enumerate(clean):
        others = [g for g in pool if g.answer != f.answer and g.id != f.id]
        corrupt.append(others[(7 * k) % len(others)] if others else None)
    keep = [i for i, c in enumerate(corrupt) if c is not None]
    return [clean[i] for i in keep], [corrupt[i] for i in keep]


def stage_conversion(model: Model, facts: list[Fact], trace: Mapping[str, Any],
                     settings: CardSettings) -> dict[str, Any]:  # fmt: skip
    """Per language, per clean prompt: the restored log-probability of the L answer
    (patched - corrupted, nats) averaged over the band's ``mlp_out``/``attn_out`` sites at the
    last token, and over as many random sites outside the band (seeded)."""
    c = settings.budget.conversion
    n_layers = int(model.cfg.n_layers)
    sites = ["mlp_out", "attn_out"]
    out: dict[str, Any] = {"sites": sites, "langs": {}, "subjects": subject_keys(facts)}
    rng = random.Random(0)
    for lang in c.langs:
        band = conversion_band(trace, lang)
        if band is None or len(band) >= n_layers:
            out["langs"][lang] = {"untestable": "no conversion band (no L answer decodable "
                                  "before the output, or the band covers every layer)"}  # fmt: skip
            continue
        clean, corrupt = _pairs(facts, trace, lang, int(c.n_prompts))
        if len(clean) < 2:
            out["langs"][lang] = {"untestable": "fewer than 2 prompt pairs"}
            continue
        res = patch_activations(model, clean, corrupt, sites, positions=[-1],
                                readout=fact_readouts(model, clean), alignment="last")  # fmt: skip
        delta = (res.values[0] - res.corrupted[0]).cpu()  # [cell, example]
        in_band = [i for i, cell in enumerate(res.cells) if cell.layer in band]
        outside = [i for i, cell in enumerate(res.cells) if cell.layer not in band]
        ctl = rng.sample(outside, min(len(in_band), len(outside)))
        out["langs"][lang] = {
            "band": band, "control_cells": [[res.cells[i].site, res.cells[i].layer] for i in ctl],
            "ids": [f.id for f in clean],
            "band_effect": delta[in_band].mean(0).tolist(),
            "control_effect": delta[ctl].mean(0).tolist(),
            "clean_minus_corrupted": (res.clean[0] - res.corrupted[0]).cpu().tolist(),
        }  # fmt: skip
    return out


def rows_conversion(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    claim = C.CONVERSION_CAUSAL
    band, ctl, ids, per = [], [], [], []
    for lang, d in sorted(data["langs"].items()):
        if "untestable" in d:
            per.append(f"{lang}: {d['untestable']}")
            continue
        band += d["band_effect"]
        ctl += d["control_effect"]
        ids += [f"{i}" for i in d["ids"]]
        per.append(
            f"{lang}: band {d['band'][0]}-{d['band'][-1]}, "
            f"{np.mean(d['band_effect']):+.2f} vs {np.mean(d['control_effect']):+.2f} nats"
        )
    if len(band) < 2:
        return [make_row(claim, None, untestable="no language with a conversion band and two "
                         "prompt pairs (" + "; ".join(per) + ")")]  # fmt: skip
    # a fact's languages, and facts sharing a subject (the stored ``subjects``), move together
    cl = item_clusters(ids, data.get("subjects"))
    eff = mean_test(band, cl)
    c = mean_test(ctl, cl)
    vs = paired_test(ctl, band, cl)
    return [make_row(claim, eff, control=c, vs_control=vs, details="restored log-probability "
                     "of the L answer per site (nats); " + "; ".join(per)
                     + cluster_note(ids, cl))]  # fmt: skip


def _trace(checkpoints: Checkpoints) -> Mapping[str, Any]:
    if not checkpoints.done("trace"):
        raise InputError("the trace stage did not finish: the conversion band comes from it")
    return checkpoints.load("trace")


def _conversion(report: ReportLike, data: Mapping[str, Any]) -> None:
    rows = []
    for lg, d in sorted(data["langs"].items()):
        if "untestable" in d:
            rows.append({"lang": lg, "band": "-", "prompts": 0, "note": d["untestable"]})
            continue
        rows.append({"lang": lg, "band": f"{d['band'][0]}-{d['band'][-1]}",
                     "prompts": len(d["ids"]),
                     "band effect (nats)": round(float(np.mean(d["band_effect"])), 3),
                     "random sites (nats)": round(float(np.mean(d["control_effect"])), 3),
                     "note": ""})  # fmt: skip
    report.add_text(
        "Clean mlp_out/attn_out patched into the corrupted-subject run at the last "
        "token; the effect is the restored log-probability of the L answer, "
        "averaged over the band's sites and over as many random sites outside it."
    )
    report.add_table(rows)


@dataclass(frozen=True)
class ConversionBudget(Budget):
    """The languages patched and the prompt pairs (clean, corrupted subject) per language."""

    langs: tuple[str, ...]
    n_prompts: int

    def __post_init__(self) -> None:
        check(self.n_prompts >= 2, "conversion.n_prompts", "must be at least 2")


QUICK = ConversionBudget(langs=("fr", "ru", "ja"), n_prompts=4)
FULL = ConversionBudget(langs=("fr", "es", "ru", "ja", "hi"), n_prompts=8)


def run(ctx: Context) -> dict[str, Any]:
    """The conversion stage's result (the band comes from the trace stage)."""
    return stage_conversion(ctx.model, ctx.lu_facts("trace"), _trace(ctx.checkpoints), ctx.settings)


#: The band's effect against random sites, per language.
report = data_section(
    "conversion", "fig-conversion", "Patching the conversion band (last token)", _conversion
)


#: One clean/corrupted pair patched at the band and random sites, in items under ``rank``.
PATCH_PER_PAIR = 2.1


def cost(settings: CardSettings, sizes: Mapping[str, Any], unit: Mapping[str, float]) -> float:
    """CPU seconds: ``n_prompts`` pairs patched in every language. The patching is not
    shared out under torchrun: every process runs it whole, ``processes`` x the per-item
    seconds (one process's share of sharded scoring)."""
    c = settings.budget.conversion
    per_item = processes(sizes) * unit.get("rank", 0.0)
    return len(c.langs) * int(c.n_prompts) * PATCH_PER_PAIR * per_item


STAGE = Stage(
    name="conversion",
    paper=LU,
    needs=("trace",),
    run=run,
    rows=(rows_conversion,),
    report=report,
    section="conversion",
    budget=ConversionBudget,
    cost=cost,
)

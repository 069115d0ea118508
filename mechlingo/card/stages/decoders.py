"""The decoders stage: the latent-English order (the English answer decodable at an earlier
lens entry than the prompt-language answer) under every registered decoder
(:mod:`mechlingo.analyses.decoders.registry`: the tuned lens when one is given, the
patchscope, and any decoder registered since), on the repair test items; the default decoder,
the logit lens, is the trace stage's own measurement. A decoder's options come from the
budget section by keyword (``{"decoders": {"tuned_lens": "DIR"}}``), else their defaults; a
decoder whose required option is not given is reported as not testable, with the reason it
declares. A decoder with a
``latent_english_NAME`` claim gets its row; the others appear in the table only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from mechlingo.analyses.decoders.lens import lens_facts
from mechlingo.analyses.decoders.registry import DecoderSpec, decoder_specs, default_decoder
from mechlingo.card import claims as C
from mechlingo.card.claims import LU
from mechlingo.card.clustered_tests import mean_test
from mechlingo.card.repair_items import cluster_note, item_clusters, subject_keys
from mechlingo.card.rules import make_row
from mechlingo.card.stages.base import (
    Budget,
    Context,
    ReportLike,
    Stage,
    check,
    data_section,
)
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.distributed import map_sharded
from mechlingo.core.types import Model
from mechlingo.data import Fact
from mechlingo.data.splits import take_shared

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings


def card_decoders() -> list[DecoderSpec]:
    """The decoders this stage reads: every registered one but the default (the logit lens,
    which the trace stage measures), in registration order."""
    default = default_decoder()
    return [s for s in decoder_specs() if s.name != default]


def decoder_options(spec: DecoderSpec, budget: DecodersBudget) -> dict[str, Any]:
    """``spec``'s option values from the budget section (a setting named as one of its
    option keywords, such as ``tuned_lens``), the defaults for the others (checked)."""
    values = {o.keyword: getattr(budget, o.keyword, None) for o in spec.options}
    given = {k: v for k, v in values.items() if v is not None}
    return spec.option_values(given)


def _order(first_en: torch.Tensor, first_l: torch.Tensor, facts: Sequence[Fact]) -> list[dict]:
    """Per non-English prompt whose English and L answers differ and one of which becomes
    decodable: whether the English one does so at an earlier entry."""
    out = []
    for i, f in enumerate(facts):
        if f.lang == "en" or (f.answer_en or f.answer).strip().casefold() == \
                f.answer.strip().casefold():  # fmt: skip
            continue
        e, a = int(first_en[i]), int(first_l[i])
        if (e >= 0 or a >= 0) and e != a:
            out.append({"id": f.id, "lang": f.lang, "en_first": bool(e >= 0 and (a < 0 or e < a))})
    return out


def stage_decoders(model: Model, facts: list[Fact], trace: Mapping[str, Any] | None,
                   settings: CardSettings, progress: bool) -> dict[str, Any]:  # fmt: skip
    """The latent-English order under each decoder on the repair test items: the logit lens
    from the trace stage's records (the same items), every other registered decoder
    (:func:`card_decoders`, with :func:`decoder_options`) on at most ``decoders.per_lang``
    ids per language (the patchscope is the costly decoder: docs/benchmarks.md)."""
    d = settings.budget.decoders
    max_rank = int(settings.budget.trace.max_rank)
    by_id = {(f.id, f.lang): f for f in facts}
    out: dict[str, Any] = {"max_rank": max_rank, "decoders": {}, "subjects": subject_keys(facts)}
    default = default_decoder()
    if trace is not None:
        recs = [r for r in trace["records"] if (r["id"], r["lang"]) in by_id]
        fs = [by_id[(r["id"], r["lang"])] for r in recs]
        first_en = torch.tensor([r["first_en_layer"] for r in recs])
        first_l = torch.tensor([r["first_answer_layer"] for r in recs])
        out["decoders"][default] = {"items": _order(first_en, first_l, fs), "source": "trace"}
    else:
        out["decoders"][default] = {"untestable": "the trace stage did not finish"}
    sub = take_shared([f for f in facts if f.lang != "en"], d.per_lang)
    for spec in card_decoders():
        values = decoder_options(spec, d)
        need = spec.missing(values)
        if need is not None:
            out["decoders"][spec.name] = {"untestable": need.why_missing}
            continue
        dec = spec.build(model, **values)

        def firsts(part: list[Fact], dec: Any = dec) -> tuple[torch.Tensor, torch.Tensor]:
            res = lens_facts(model, part, decoder=dec, progress=progress,
                             batch_size=settings.batch())  # fmt: skip
            return (res.first_layer_within("en", max_rank, before_last=True),
                    res.first_layer_within("answer", max_rank))  # fmt: skip

        # one lens run per language, shared out among the ranks under torchrun
        parts = [[f for f in sub if f.lang == lg] for lg in dict.fromkeys(f.lang for f in sub)]
        got = map_sharded(firsts, parts, costs=[len(p) for p in parts])
        sub = [f for p in parts for f in p]
        first_en, first_l = (torch.cat([g[i] for g in got]) if got else torch.zeros(0)
                             for i in (0, 1))  # fmt: skip
        out["decoders"][spec.name] = {"items": _order(first_en, first_l, sub),
                                      "n_prompts": len(sub)}  # fmt: skip
    return out


def rows_decoders(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One latent-English row per decoder with a claim (``latent_english_NAME``): the share
    of ordered prompts where English comes first, clustered by subject (the stored
    ``subjects``; the fact id where no subject is shared across relations; a result stored
    without ``subjects``: the subject each id names, else the fact id), against 0.5. The logit
    lens is ``latent_english``'s own measurement (the trace records): no second row."""
    rows = []
    claims = {c.id: c for c in C.CLAIMS}
    for name in dict.fromkeys([*(s.name for s in card_decoders()), *data["decoders"]]):
        claim = claims.get(f"latent_english_{name}")
        if claim is None or name == default_decoder():
            continue
        d = data["decoders"].get(name) or {"untestable": "the decoder did not run"}
        if "untestable" in d:
            rows.append(make_row(claim, None, untestable=d["untestable"]))
            continue
        items = d["items"]
        if not items:
            rows.append(make_row(claim, None, untestable="no prompt where the English or the L "
                                 "answer becomes decodable with distinct words"))  # fmt: skip
            continue
        ids = [x["id"] for x in items]
        cl = item_clusters(ids, data.get("subjects"))
        t = mean_test([float(x["en_first"]) for x in items], cl, null=0.5)
        per = {}
        for x in items:
            per.setdefault(x["lang"], []).append(x["en_first"])
        txt = ", ".join(f"{lg} {sum(v)}/{len(v)}" for lg, v in sorted(per.items()))
        rows.append(
            make_row(
                claim,
                t,
                details=f"English first per language: {txt}" + cluster_note(ids, cl),
                extra={"per_lang": {lg: [sum(v), len(v)] for lg, v in per.items()}},
            )
        )
    return rows


def _maybe(checkpoints: Checkpoints, name: str) -> Mapping[str, Any] | None:
    return checkpoints.load(name) if checkpoints.done(name) else None


def _decoders(report: ReportLike, data: Mapping[str, Any]) -> None:
    rows = []
    for name, d in data["decoders"].items():
        if "untestable" in d:
            rows.append({"decoder": name, "lang": "-", "English first": "-",
                         "ordered prompts": 0, "note": d["untestable"]})  # fmt: skip
            continue
        per: dict[str, list[bool]] = {}
        for x in d["items"]:
            per.setdefault(x["lang"], []).append(bool(x["en_first"]))
        for lg, v in sorted(per.items()):
            rows.append({"decoder": name, "lang": lg, "English first": sum(v),
                         "ordered prompts": len(v), "note": ""})  # fmt: skip
    report.add_text("Per decoder and language: prompts whose English or L answer reaches rank "
                    f"<= {data['max_rank']} at some lens entry, with distinct words, and how "
                    "many of them reach it with the English answer first.")  # fmt: skip
    report.add_table(rows)


@dataclass(frozen=True)
class DecodersBudget(Budget):
    """``per_lang``: test ids per language that each decoder reads (the patchscope is the
    costly decoder); ``tuned_lens``: a saved lens folder (the tuned lens's option; ``None``:
    no tuned-lens row). Another decoder runs with its defaults."""

    per_lang: int | None
    tuned_lens: str | None

    def __post_init__(self) -> None:
        check(self.per_lang is None or self.per_lang >= 1, "decoders.per_lang",
              "must be at least 1")  # fmt: skip


QUICK = DecodersBudget(per_lang=4, tuned_lens=None)
FULL = DecodersBudget(per_lang=8, tuned_lens=None)


def run(ctx: Context) -> dict[str, Any]:
    """The decoders stage's result (the trace's records give the logit lens)."""
    return stage_decoders(ctx.model, ctx.lu_facts("trace"), _maybe(ctx.checkpoints, "trace"),
                          ctx.settings, ctx.progress)  # fmt: skip


#: The latent-English order per decoder and language.
report = data_section(
    "decoders", "fig-decoders", "The latent-English order under each decoder", _decoders
)


def cost(settings: CardSettings, sizes: Mapping[str, Any], unit: Mapping[str, float]) -> float:
    """CPU seconds: each decoder the stage reads (:func:`card_decoders`; not one whose
    required option is missing) on ``per_lang`` ids of every non-English language, at its
    registered ``card_cost`` per prompt (the patchscope's measured; a given tuned lens as
    much again)."""
    d = settings.budget.decoders
    langs = int(sizes.get("lu_langs", len(settings.budget.lu_langs)))
    prompts = int(d.per_lang or 0) * max(0, langs - 1)
    per_prompt = sum(s.card_cost for s in card_decoders()
                     if s.missing(decoder_options(s, d)) is None)  # fmt: skip
    return per_prompt * prompts * unit.get("rank", 0.0)


STAGE = Stage(
    name="decoders",
    paper=LU,
    needs=("trace",),
    run=run,
    rows=(rows_decoders,),
    report=report,
    section="decoders",
    budget=DecodersBudget,
    cost=cost,
)

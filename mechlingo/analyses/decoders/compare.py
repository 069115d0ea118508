"""Several decoders over the same prompts, and where the English answer leads.

:func:`compare_decoders` runs :func:`mechlingo.analyses.decoders.lens.lens_facts` once per
decoder (logit lens, tuned lenses, patchscope) on the same facts, so their latent-language
curves line up entry by entry (a :class:`DecoderComparison`). :func:`english_lead` asks of
each result the question behind the "English pivot": at which layers does the English answer
lead the prompt-language answer? (Its docstring has the definitions;
``docs/methods/logit-lens.md``, "Where the English answer leads", the measured table.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

import torch

from mechlingo.analyses.decoders.lens import LensFactsArgs, LensResult, lens_facts
from mechlingo.analyses.decoders.registry import runnable_decoders
from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.kernels.significance import bootstrap_mean, wilson
from mechlingo.viz.common import html_summary, interval_text
from mechlingo.viz.lens import DecoderPanel, decoder_curves_figure

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from mechlingo.data import Fact

__all__ = ["DecoderComparison", "compare_decoders", "english_lead"]


def _differs(result: LensResult, i: int) -> bool:
    a, e = result.answers["answer"][i], result.answers["en"][i]
    return a.strip().casefold() != e.strip().casefold()


def _lead_range(
    p_en: torch.Tensor, p_ans: torch.Tensor, layers: Sequence[int], min_prob: float, seed: int
) -> dict[str, Any]:
    """Entries where the mean English probability is at least ``min_prob`` and the mean of
    ``P(English) - P(prompt language)`` is above 0 with its bootstrap interval above 0."""
    per_entry, leading = [], []
    diff = p_en - p_ans
    for li, entry in enumerate(layers):
        ci = bootstrap_mean(diff[li].tolist(), seed=seed)
        per_entry.append({"layer": entry, "p_en": float(p_en[li].mean()),
                          "p_answer": float(p_ans[li].mean()), **ci.to_json()})  # fmt: skip
        if ci.above(0.0) and float(p_en[li].mean()) >= min_prob:
            leading.append(entry)
    span = [min(leading), max(leading)] if leading else None
    return {"layers": leading, "span": span, "mean_diff": per_entry}


def english_lead(
    result: LensResult,
    *,
    langs: Sequence[str] | None = None,
    min_prob: float = 0.01,
    seed: int = SEED,
) -> dict[str, dict[str, Any]]:
    """Where the English answer leads the prompt-language answer, per prompt language.

    Only prompts whose two answers differ count (``n``), at the entries before the output.
    English *leads* at an entry when its mass is above the prompt-language answer's and at
    least ``min_prob``; the *leading range* is the entries where the mean English mass is at
    least ``min_prob`` and the mean of ``P(English) - P(prompt language)`` is above 0 with its
    paired 95% bootstrap interval.

    Returns:
        ``{lang: {"n", "ever": wilson share of prompts where English leads at some entry,
        "first_layer": bootstrap mean of the first leading entry over those prompts,
        "first_layer_median", "share_by_layer": [wilson per entry], "range": {"layers",
        "span", "mean_diff"}}}``.

    Raises:
        InputError: the result does not track English.
    """
    if "en" not in result.tracks:
        raise InputError("the lens result does not track the English answer",
                         fix="run it with track_langs=['en']")  # fmt: skip
    layers = result.layers[:-1] if result.layers[-1] == result.n_layers else result.layers
    p_ans, p_en = result.prob("answer")[: len(layers)], result.prob("en")[: len(layers)]
    lead = (p_en > p_ans) & (p_en >= min_prob)  # [entry, prompt]
    langs = list(langs) if langs else [lg for lg in dict.fromkeys(result.langs) if lg != "en"]
    out: dict[str, dict[str, Any]] = {}
    for lg in langs:
        idx = [i for i, x in enumerate(result.langs) if x == lg and _differs(result, i)]
        if not idx:
            out[lg] = {"n": 0}
            continue
        sel = torch.tensor(idx)
        lg_lead = lead[:, sel]
        ever = lg_lead.any(0)
        first = [layers[int(lg_lead[:, j].float().argmax())] for j in range(len(idx)) if ever[j]]
        out[lg] = {
            "n": len(idx),
            "ever": wilson(int(ever.sum()), len(idx)).to_json(),
            "first_layer": bootstrap_mean(first, seed=seed).to_json(),
            "first_layer_median": float(torch.tensor(first).float().median()) if first else None,
            "share_by_layer": [
                wilson(int(lg_lead[li].sum()), len(idx)).to_json() for li in range(len(layers))
            ],
            "range": _lead_range(p_en[:, sel], p_ans[:, sel], layers, min_prob, seed),
        }
    return out


@dataclass
class DecoderComparison:
    """Lens results of several decoders on the same facts.

    Attributes:
        results: ``{decoder name: LensResult}`` in the order given.
    """

    results: dict[str, LensResult]

    def english_lead(
        self, *, langs: Sequence[str] | None = None, min_prob: float = 0.01, seed: int = SEED
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """:func:`english_lead` of every decoder: ``{decoder: {lang: ...}}``."""
        return {
            name: english_lead(r, langs=langs, min_prob=min_prob, seed=seed)
            for name, r in self.results.items()
        }

    def pivot_table(
        self, *, langs: Sequence[str] | None = None, min_prob: float = 0.01, seed: int = SEED
    ) -> list[dict[str, Any]]:
        """One row per (decoder, language): n, the share of prompts where English ever leads
        (Wilson 95%), the mean first leading layer (bootstrap 95%) and the leading range
        (the options of :func:`english_lead`)."""
        rows = []
        for name, by_lang in self.english_lead(langs=langs, min_prob=min_prob, seed=seed).items():
            for lg, d in by_lang.items():
                if not d["n"]:
                    rows.append({"decoder": name, "lang": lg, "n": 0})
                    continue
                ev, fl = d["ever"], d["first_layer"]
                rows.append({"decoder": name, "lang": lg, "n": d["n"], "ever": ev["estimate"],
                             "ever_lo": ev["lo"], "ever_hi": ev["hi"], "first_layer": fl["estimate"],
                             "first_lo": fl["lo"], "first_hi": fl["hi"], "n_first": fl["n"],
                             "first_median": d["first_layer_median"],
                             "range": d["range"]["span"], "range_layers": d["range"]["layers"]})  # fmt: skip
        return rows

    def __repr__(self) -> str:
        first = next(iter(self.results.values()))
        return f"DecoderComparison({list(self.results)}, {len(first.prompts)} prompts)"

    def _repr_html_(self) -> str:
        """Per decoder and language: n, the share of prompts where English ever leads (Wilson
        95%) and the mean first leading layer (bootstrap 95%)."""
        rows = [{"decoder": r["decoder"], "lang": r["lang"], "n": r["n"],
                 "English ever leads [95% CI]": interval_text(r.get("ever"), r.get("ever_lo"),
                                                              r.get("ever_hi")),
                 "first leading layer [95% CI]": interval_text(
                     r.get("first_layer"), r.get("first_lo"), r.get("first_hi"))}
                for r in self.pivot_table()]  # fmt: skip
        return html_summary(repr(self), rows)

    def fig_curves(self, langs: Sequence[str] | None = None) -> go.Figure:
        """Latent-language curves, entropy and energy of every decoder side by side, pooled
        over the prompts in ``langs`` (default: every language but English, or all when
        there are only English prompts)."""
        first = next(iter(self.results.values()))
        if langs is None:
            langs = [lg for lg in dict.fromkeys(first.langs) if lg != "en"] or list(first.langs)
        panels = {name: _panel(r, langs) for name, r in self.results.items()}
        n_prompts = sum(lg in set(langs) for lg in first.langs)
        return decoder_curves_figure(panels, langs=langs, n_prompts=n_prompts)


def _panel(result: LensResult, langs: Sequence[str]) -> DecoderPanel:
    """One decoder's curves over the prompts of ``langs`` (for :meth:`fig_curves`)."""
    idx = torch.tensor([i for i, lg in enumerate(result.langs) if lg in set(langs)])
    tracks = [t for t in ("answer", "en") if t in result.tracks]
    t = {k: result.track_index(k) for k in tracks}

    def select(values: torch.Tensor | None) -> torch.Tensor:
        if values is None:
            return torch.full((len(result.layers), len(idx)), float("nan"))
        return values[:, idx]

    return DecoderPanel(
        layers=result.layers,
        logprob={k: result.logprob[:, idx, t[k]] for k in tracks},
        rank={k: result.rank[:, idx, t[k]] for k in tracks},
        entropy=select(result.entropy),
        energy=select(result.energy),
    )


def compare_decoders(
    model: Model,
    facts: Sequence[Fact],
    decoders: Mapping[str, Any] | Sequence[str] | None = None,
    **kwargs: Unpack[LensFactsArgs],
) -> DecoderComparison:
    """Run :func:`~mechlingo.analyses.decoders.lens.lens_facts` with each decoder on the same facts.

    Args:
        decoders: registered names (``None``: every registered decoder that runs without
            options, :func:`~mechlingo.analyses.decoders.registry.runnable_decoders`) or
            ``{label: decoder}`` where a decoder is a name or a decoder object (e.g.
            ``{"tuned-en": lens_en, "tuned-mix": lens_mix}``, two ``TunedLens``).
        kwargs: passed to every :func:`lens_facts` call (``track_langs``, ``batch_size``,
            ``decoder_options``, ...).
    """
    if decoders is None:
        decoders = runnable_decoders()
    items = decoders.items() if isinstance(decoders, Mapping) else [(d, d) for d in decoders]
    items = list(items)
    if not items:
        raise InputError("no decoders to compare")
    results = {label: lens_facts(model, facts, decoder=dec, **kwargs) for label, dec in items}
    return DecoderComparison(results)

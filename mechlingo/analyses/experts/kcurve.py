"""Expert neurons, part 3: the k curve, and the papers' rule for choosing ``k``.

:func:`k_curve` measures, for each ``k``, how often text sampled from a bare BOS prompt (and
greedy continuations of short neutral prompts) is in the target language with the clamp on
(py3langid, offline, :func:`mechlingo.data.langid.identify_languages`; Wilson intervals), and
the perplexity of held-out text of every language (the side effect,
:func:`mechlingo.activations.likelihood.line_nll`; bootstrap intervals over lines), with the
random-neuron control at the same ``k``. :func:`choose_k` applies the papers' rule: the
highest target rate among the ``k`` whose target-language perplexity stays within a budget
(default: at most :data:`PPL_BUDGET` times the no-clamp perplexity); ``others="geomean"`` or
``"max"`` is a stricter rule that bounds the other languages too. ``k`` is never chosen by
retrieval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.likelihood import line_nll, sample_from_bos
from mechlingo.activations.pooled import check_texts
from mechlingo.analyses.experts.selection import ExpertResult
from mechlingo.core.defaults import SAMPLE_NEW_TOKENS
from mechlingo.core.errors import ExpertError
from mechlingo.core.types import FwdHooks, Model
from mechlingo.data.langid import identify_languages
from mechlingo.interventions import Intervention, intervention_hooks
from mechlingo.kernels.significance import bootstrap_perplexity, mcnemar, perplexity_ratio, wilson
from mechlingo.scoring.evaluate import greedy_generate
from mechlingo.viz.common import html_summary, interval_text
from mechlingo.viz.experts import k_curve_figure

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = ["NEUTRAL_PROMPTS", "PPL_BUDGET", "KCurve", "OthersRule", "choose_k", "k_curve"]

#: Neutral prompts whose greedy continuations give the k curve's ``target_rate_prompt``.
NEUTRAL_PROMPTS = ("1.", "*", "Text:", '"')

#: Default perplexity budget of the k rule: a clamp may at most double held-out perplexity.
PPL_BUDGET = 2.0

OthersRule = Literal["geomean", "max", "none"]


def choose_k(
    rows: Sequence[Mapping[str, Any]],
    lang: str,
    *,
    ppl_budget: float = PPL_BUDGET,
    others: OthersRule = "none",
) -> dict[str, Any]:
    """The papers' rule for ``k`` (Sundar et al. after Kojima et al.): the ``k`` whose clamp
    makes generations from a bare BOS prompt most often the target language, among the ``k``
    whose side effect on perplexity stays within a budget. Never retrieval.

    A ``k`` (rows with ``arm == "experts"``) is *within budget* when, on held-out lines, the
    target language's perplexity is at most ``ppl_budget`` times its perplexity without a
    clamp (the ``arm == "none"`` row); with a stricter ``others``, the other languages'
    perplexity ratios, combined by it, must be too: ``"none"`` (default: the target only, the
    papers' rule), ``"geomean"`` (their geometric mean, the typical side effect) or ``"max"``
    (every other language). Among the
    within-budget ``k`` the highest ``target_rate_bos`` wins; ties go to the smaller ``k``.

    Args:
        rows: k-curve rows with ``k``, ``arm``, ``target_rate_bos`` and ``ppl_<lang>``.
        lang: the target language (``ppl_<lang>`` must be among the columns).

    Returns:
        ``{"k"``: the chosen ``k``, or ``None`` when no ``k`` is within budget; ``"rule"``: the
        rule in words; ``"ppl_budget"``, ``"others"``, ``"target_rate_none"`` and
        ``"candidates"``: per ``k`` its rate, perplexity ratios and whether it is within
        budget``}``.
    """
    if ppl_budget <= 0 or not math.isfinite(ppl_budget):
        raise ExpertError(f"the perplexity budget must be a positive number, got {ppl_budget}")
    if others not in ("geomean", "max", "none"):
        raise ExpertError(f"others must be 'geomean', 'max' or 'none', got {others!r}")
    base = [r for r in rows if r["arm"] == "none"]
    if not base:
        raise ExpertError("the k curve has no 'none' row (no clamp) to measure perplexity against")
    b = base[0]
    langs = [c[4:] for c in b if c.startswith("ppl_") and not c.startswith("ppl_ratio_")]
    langs = [x for x in langs if not x.endswith(("_lo", "_hi"))]
    if lang not in langs:
        raise ExpertError(f"no held-out perplexity of the target {lang!r}; have {langs}")
    cands = []
    for r in sorted((r for r in rows if r["arm"] == "experts"), key=lambda r: r["k"]):
        ratios = {x: r[f"ppl_{x}"] / b[f"ppl_{x}"] for x in langs}
        rest = [v for x, v in ratios.items() if x != lang]
        if others == "none" or not rest:
            agg = None
        elif others == "max":
            agg = max(rest)
        else:
            agg = math.exp(sum(math.log(v) for v in rest) / len(rest))
        ok = ratios[lang] <= ppl_budget and (agg is None or agg <= ppl_budget)
        cands.append(
            {
                "k": int(r["k"]),
                "target_rate_bos": r["target_rate_bos"],
                "ppl_ratio_target": ratios[lang],
                "ppl_ratio_others": agg,
                "within_budget": bool(ok),
            }
        )
    ok = [c for c in cands if c["within_budget"]]
    best = max(ok, key=lambda c: (c["target_rate_bos"], -c["k"])) if ok else None
    agg_words = {
        "geomean": "the geometric mean of the other languages' ratios",
        "max": "every other language's ratio",
        "none": "(other languages not constrained)",
    }[others]
    rule = (
        f"k = argmax over k of the fraction of bare-BOS generations identified as {lang}, "
        f"among k whose held-out perplexity ratio (clamp / no clamp) is <= {ppl_budget:g} for "
        f"{lang} and for {agg_words}; ties to the smaller k; never chosen by retrieval"
    )
    return {
        "lang": lang,
        "k": None if best is None else best["k"],
        "rule": rule,
        "ppl_budget": ppl_budget,
        "others": others,
        "target_rate_none": b["target_rate_bos"],
        "candidates": cands,
    }


@dataclass
class KCurve:
    """Effect of the expert clamp as a function of ``k``, with the random control.

    ``rows``: one dict per (k, arm) with ``arm`` in ``{"experts", "random", "none"}``:

    * ``target_rate_bos``: fraction of the ``n_bos`` samples from a bare BOS prompt identified
      as the target language, with its Wilson 95% interval ``target_rate_bos_lo/_hi``;
    * ``target_rate_prompt``: the same for greedy continuations of neutral prompts;
    * ``ppl_<lang>``: held-out perplexity of every language, with a bootstrap 95% interval
      over lines (``ppl_<lang>_lo/_hi``), and ``ppl_ratio_<lang>``: that perplexity over the
      no-clamp perplexity of the same lines (paired bootstrap ``_lo/_hi``);
    * ``examples`` (the generations) and ``bos_hits`` (per BOS sample: in the target?).
    """

    lang: str
    rows: list[dict[str, Any]]

    def to_dataframe(self) -> pd.DataFrame:
        import pandas as pd

        skip = ("examples", "bos_hits")
        return pd.DataFrame([{k: v for k, v in r.items() if k not in skip} for r in self.rows])

    def choose(self, ppl_budget: float = PPL_BUDGET, others: OthersRule = "none") -> dict:
        """:func:`choose_k` on this curve."""
        return choose_k(self.rows, self.lang, ppl_budget=ppl_budget, others=others)

    def tests(self) -> list[dict[str, Any]]:
        """Per ``k``: exact McNemar tests of the BOS target hits of the expert clamp against no
        clamp and against the random control at the same ``k`` (samples are paired by index:
        every arm draws with the same seed)."""

        none = next((r for r in self.rows if r["arm"] == "none"), None)
        out = []
        for r in self.rows:
            if r["arm"] != "experts":
                continue
            t: dict[str, Any] = {"k": r["k"]}
            if none is not None:
                t["vs_none"] = mcnemar(none["bos_hits"], r["bos_hits"])
            ctl = next((c for c in self.rows if c["arm"] == "random" and c["k"] == r["k"]), None)
            if ctl is not None:
                t["vs_random"] = mcnemar(ctl["bos_hits"], r["bos_hits"])
            out.append(t)
        return out

    def records(self) -> list[dict[str, Any]]:
        """JSON-ready rows (without the generations)."""
        return [{k: v for k, v in r.items() if k != "examples"} for r in self.rows]

    def __repr__(self) -> str:
        ks = sorted({r["k"] for r in self.rows})
        return f"KCurve({self.lang}, k in {ks}, {len(self.rows)} rows)"

    def _repr_html_(self) -> str:
        """Per (k, arm) the share of BOS samples in the target language with its Wilson
        95% interval and n."""
        rows = [{"k": r["k"], "arm": r["arm"],
                 f"BOS samples in {self.lang} [95% CI]": interval_text(
                     r.get("target_rate_bos"), r.get("target_rate_bos_lo"),
                     r.get("target_rate_bos_hi")),
                 "n": r.get("n_bos")}
                for r in sorted(self.rows, key=lambda r: (r["k"], r["arm"]))]  # fmt: skip
        return html_summary(repr(self), rows)

    def fig_k_curve(self, chosen: int | None = None) -> go.Figure:
        """Target-language rate and held-out perplexity against ``k`` (experts, random
        control, no clamp), with the ``chosen`` k marked."""
        return k_curve_figure(self.rows, self.lang, chosen)


def _fwd_hooks(model: Model, intervention: Intervention | None) -> FwdHooks:
    """The hooks of ``intervention`` on ``model`` (none without one)."""
    return intervention_hooks(model, intervention)


def _k_arms(
    experts: ExpertResult,
    lang: str,
    ks: Sequence[int],
    value: Literal["mean", "median"],
    seed: int,
    control: bool,
) -> list[tuple[int, str, Intervention | None]]:
    """``(k, arm, intervention)`` of every run of the k curve: no clamp first, then per ``k``
    the expert clamp and (with ``control``) the random-neuron clamp."""
    arms: list[tuple[int, str, Intervention | None]] = [(0, "none", None)]
    for k in ks:
        arms.append((int(k), "experts", experts.clamp(lang, int(k), value=value)))
        if control:
            arms.append(
                (int(k), "random", experts.random_clamp(lang, int(k), value=value, seed=seed))
            )
    return arms


def _generation_rates(
    model: Model,
    lang: str,
    intervention: Intervention | None,
    id_langs: Sequence[str],
    *,
    n_samples: int,
    max_new_tokens: int,
    prompts: Sequence[str],
    seed: int,
) -> dict[str, Any]:
    """One arm's generations (bare-BOS samples and greedy continuations of ``prompts``) and
    how often they are in ``lang``: the row's rate columns, ``bos_hits`` and ``examples``."""
    bos_texts = sample_from_bos(
        model,
        n_samples,
        max_new_tokens=max_new_tokens,
        fwd_hooks=_fwd_hooks(model, intervention),
        seed=seed,
    )
    prompt_texts = (
        greedy_generate(
            model,
            list(prompts),
            max_new_tokens=max_new_tokens,
            intervention=intervention,
            stop_at_newline=False,
        )
        if prompts
        else []
    )
    ids_bos = identify_languages(bos_texts, id_langs)
    ids_prompt = identify_languages(prompt_texts, id_langs)
    hits = [x == lang for x in ids_bos]
    w = wilson(sum(hits), len(hits))
    return {
        "n_bos": len(hits),
        "target_bos": sum(hits),
        "target_rate_bos": w.estimate,
        "target_rate_bos_lo": w.lo,
        "target_rate_bos_hi": w.hi,
        "target_rate_prompt": (
            sum(x == lang for x in ids_prompt) / len(ids_prompt) if ids_prompt else float("nan")
        ),
        "bos_hits": hits,
        "examples": [
            {"source": "BOS", "text": t, "lang": x} for t, x in zip(bos_texts, ids_bos, strict=True)
        ]
        + [
            {"source": p, "text": t, "lang": x}
            for p, t, x in zip(prompts, prompt_texts, ids_prompt, strict=True)
        ],
    }


def _heldout_perplexities(
    model: Model,
    heldout: Mapping[str, Sequence[str]],
    intervention: Intervention | None,
    base_nll: dict[str, Tensor] | None,
    *,
    max_tokens: int | None,
    seed: int,
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """One arm's held-out perplexity of every language with bootstrap intervals over lines,
    and its ratio to the no-clamp arm's (``base_nll``; ``None`` for the no-clamp arm itself,
    whose ratios are 1). Returns the row's columns and the per-line NLL of each language."""
    row: dict[str, Any] = {}
    nlls: dict[str, Tensor] = {}
    hooks = _fwd_hooks(model, intervention)
    for hl, sents in heldout.items():
        nll, cnt = line_nll(model, sents, fwd_hooks=hooks, max_tokens=max_tokens)
        keep = cnt > 0
        if not bool(keep.any()):
            raise ExpertError(f"no tokens to score in the held-out {hl} lines")
        nll, cnt = nll[keep], cnt[keep]
        nlls[hl] = nll
        pp = bootstrap_perplexity(nll.numpy(), cnt.numpy(), seed=seed)
        row[f"ppl_{hl}"], row[f"ppl_{hl}_lo"], row[f"ppl_{hl}_hi"] = pp.estimate, pp.lo, pp.hi
        if base_nll is None:
            for end in ("", "_lo", "_hi"):
                row[f"ppl_ratio_{hl}{end}"] = 1.0
        else:
            pr = perplexity_ratio(base_nll[hl].numpy(), nll.numpy(), cnt.numpy(), seed=seed)
            row[f"ppl_ratio_{hl}"] = pr.estimate
            row[f"ppl_ratio_{hl}_lo"], row[f"ppl_ratio_{hl}_hi"] = pr.lo, pr.hi
    return row, nlls


def k_curve(
    model: Model,
    experts: ExpertResult,
    lang: str,
    ks: Sequence[int],
    heldout: Mapping[str, Sequence[str]],
    *,
    n_samples: int = 32,
    max_new_tokens: int = SAMPLE_NEW_TOKENS,
    prompts: Sequence[str] = NEUTRAL_PROMPTS,
    value: Literal["mean", "median"] = "mean",
    seed: int = 0,
    control: bool = True,
    max_tokens: int | None = 32,
    progress: bool = False,
    stage_store: Callable[[str, Callable[[], dict]], dict] | None = None,
) -> KCurve:
    """For each ``k``: language of generations with the clamp on and held-out perplexity of
    every language, for the experts, the random control, and no clamp (``k = 0``), with
    Wilson intervals for the rates and bootstrap intervals (over lines) for perplexities.

    The language of each generation is identified by py3langid among the languages of
    ``heldout`` and ``experts.langs``; generations with no letters count as not in the target.
    Choose ``k`` from the result with :meth:`KCurve.choose` (the papers' rule).

    ``stage_store(name, fn)``, when given, runs each arm (``name``: ``"none"``, ``"k50-experts"``,
    ``"k50-random"``...) and returns ``fn()`` (a JSON-able dict) or a stored equal result (a
    resumable stage, :class:`mechlingo.core.stages.Stages`; ``experts --resume``). Every arm
    draws with ``seed`` alone, so an arm's row does not depend on the other ``ks``.
    """

    if not ks:
        raise ExpertError("give at least one k")
    if n_samples < 1:
        raise ExpertError(f"n_samples must be >= 1, got {n_samples}")
    id_langs = list(dict.fromkeys([*experts.langs, *heldout]))
    check_texts(heldout, 1, error=ExpertError)
    rows = []
    base_nll: dict[str, Tensor] | None = None
    arms = _k_arms(experts, lang, ks, value, seed, control)
    run = stage_store or (lambda name, fn: fn())
    opts = {"n_samples": n_samples, "max_new_tokens": max_new_tokens, "prompts": prompts,
            "seed": seed, "max_tokens": max_tokens}  # fmt: skip
    for k, arm, iv in tqdm(arms, desc="k curve", disable=not progress):
        name = "none" if arm == "none" else f"k{k}-{arm}"
        out = run(name, lambda k=k, arm=arm, iv=iv, base=base_nll: _k_arm(
            model, lang, k, arm, iv, id_langs, heldout, base, **opts))  # fmt: skip
        if arm == "none":
            base_nll = {hl: torch.tensor(v, dtype=torch.float64) for hl, v in out["nll"].items()}
        rows.append(out["row"])
    return KCurve(lang, rows)


def _k_arm(
    model: Model,
    lang: str,
    k: int,
    arm: str,
    iv: Intervention | None,
    id_langs: Sequence[str],
    heldout: Mapping[str, Sequence[str]],
    base_nll: dict[str, Tensor] | None,
    *,
    n_samples: int,
    max_new_tokens: int,
    prompts: Sequence[str],
    seed: int,
    max_tokens: int | None,
) -> dict[str, Any]:
    """One run of the k curve: ``{"row": the KCurve row, "nll": {lang: per-line NLL}}``."""
    gen = _generation_rates(
        model,
        lang,
        iv,
        id_langs,
        n_samples=n_samples,
        max_new_tokens=max_new_tokens,
        prompts=prompts,
        seed=seed,
    )
    ppl, nlls = _heldout_perplexities(
        model, heldout, iv, base_nll, max_tokens=max_tokens, seed=seed
    )
    hits, examples = gen.pop("bos_hits"), gen.pop("examples")
    row = {"k": k, "arm": arm, **gen, **ppl, "bos_hits": hits, "examples": examples}
    return {"row": row, "nll": {hl: v.tolist() for hl, v in nlls.items()}}

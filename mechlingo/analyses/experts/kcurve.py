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
from mechlingo.analyses.experts.stacked import stacked_bos_samples, stacked_line_nll
from mechlingo.core.defaults import PROGRESS, SAMPLE_NEW_TOKENS, SEED
from mechlingo.core.distributed import (
    dist_info,
    gather_lists,
    scoring_sharded,
    shard_bounds,
    sharded_scoring,
)
from mechlingo.core.errors import ExpertError
from mechlingo.core.types import Model
from mechlingo.data.langid import identify_languages
from mechlingo.interventions import Intervention, intervention_hooks
from mechlingo.kernels.significance import bootstrap_perplexity, mcnemar, perplexity_ratio, wilson
from mechlingo.scoring.evaluate import DecodeOptions, generate_conditions, greedy_generate
from mechlingo.viz.common import html_summary, interval_text
from mechlingo.viz.experts import k_curve_figure

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = [
    "NEUTRAL_PROMPTS",
    "PPL_BUDGET",
    "KCurve",
    "KCurveOptions",
    "OthersRule",
    "choose_k",
    "k_curve",
]

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


@dataclass(frozen=True)
class _Arm:
    """One run of the k curve: its ``k``, ``arm``, intervention, checkpoint ``name`` and,
    for a random arm, the seed of its neuron set."""

    k: int
    arm: str
    iv: Intervention | None
    name: str
    control_seed: int | None = None


def _k_arms(
    experts: ExpertResult,
    lang: str,
    ks: Sequence[int],
    value: Literal["mean", "median"],
    control_seeds: Sequence[int] | None,
    layer_matched: bool,
    seed: int,
) -> list[_Arm]:
    """Every run of the k curve: no clamp first, then per ``k`` the expert clamp and one
    random-neuron clamp per control seed (``None``: one, of ``seed``; none for ``()``)."""
    arms = [_Arm(0, "none", None, "none")]
    seeds = [seed] if control_seeds is None else [int(s) for s in control_seeds]
    for k in (int(k) for k in ks):
        arms.append(_Arm(k, "experts", experts.clamp(lang, k, value=value), f"k{k}-experts"))
        for s in seeds:
            iv = experts.random_clamp(lang, k, value=value, seed=s, layer_matched=layer_matched)
            name = f"k{k}-random" if control_seeds is None else f"k{k}-random_s{s}"
            arms.append(_Arm(k, "random", iv, name, s))
    return arms


def _rates(
    lang: str, bos_texts: Sequence[str], prompt_texts: Sequence[str], prompts: Sequence[str],
    id_langs: Sequence[str],
) -> dict[str, Any]:  # fmt: skip
    """One arm's generations (bare-BOS samples and greedy continuations of ``prompts``) and
    how often they are in ``lang``: the row's rate columns, ``bos_hits`` and ``examples``."""
    ids_bos = identify_languages(list(bos_texts), id_langs)
    ids_prompt = identify_languages(list(prompt_texts), id_langs)
    hits = [x == lang for x in ids_bos]
    w = wilson(sum(hits), len(hits))
    rate_prompt = (sum(x == lang for x in ids_prompt) / len(ids_prompt) if ids_prompt
                   else float("nan"))  # fmt: skip
    return {
        "n_bos": len(hits), "target_bos": sum(hits), "target_rate_bos": w.estimate,
        "target_rate_bos_lo": w.lo, "target_rate_bos_hi": w.hi,
        "target_rate_prompt": rate_prompt, "bos_hits": hits,
        "examples": [{"source": "BOS", "text": t, "lang": x}
                     for t, x in zip(bos_texts, ids_bos, strict=True)]
        + [{"source": p, "text": t, "lang": x}
           for p, t, x in zip(prompts, prompt_texts, ids_prompt, strict=True)],
    }  # fmt: skip


def _kept(hl: str, nll: Tensor, cnt: Tensor) -> tuple[Tensor, Tensor]:
    """The lines of ``hl`` with a token to score (their NLL and token counts)."""
    keep = cnt > 0
    if not bool(keep.any()):
        raise ExpertError(f"no tokens to score in the held-out {hl} lines")
    return nll[keep], cnt[keep]


def _ppl_columns(
    nlls: Mapping[str, tuple[Tensor, Tensor]], base_nll: dict[str, Tensor] | None, seed: int
) -> dict[str, Any]:
    """One arm's held-out perplexity of every language with bootstrap intervals over lines,
    and its ratio to the no-clamp arm's (``base_nll``; ``None`` for the no-clamp arm itself,
    whose ratios are 1)."""
    row: dict[str, Any] = {}
    for hl, (nll, cnt) in nlls.items():
        pp = bootstrap_perplexity(nll.numpy(), cnt.numpy(), seed=seed)
        row[f"ppl_{hl}"], row[f"ppl_{hl}_lo"], row[f"ppl_{hl}_hi"] = pp.estimate, pp.lo, pp.hi
        if base_nll is None:
            for end in ("", "_lo", "_hi"):
                row[f"ppl_ratio_{hl}{end}"] = 1.0
        else:
            pr = perplexity_ratio(base_nll[hl].numpy(), nll.numpy(), cnt.numpy(), seed=seed)
            row[f"ppl_ratio_{hl}"] = pr.estimate
            row[f"ppl_ratio_{hl}_lo"], row[f"ppl_ratio_{hl}_hi"] = pr.lo, pr.hi
    return row


#: The most rows of one stacked pass of the k curve (conditions x BOS samples).
MAX_STACKED_ROWS = 256


def _outputs_one(
    model: Model, iv: Intervention | None, heldout: Mapping[str, Sequence[str]], *,
    n_samples: int, max_new_tokens: int, prompts: Sequence[str], seed: int,
    max_tokens: int | None,
) -> dict[str, Any]:  # fmt: skip
    """One arm run alone: its BOS samples, prompt continuations and per-line NLL."""
    hooks = intervention_hooks(model, iv)
    bos = sample_from_bos(model, n_samples, max_new_tokens=max_new_tokens, fwd_hooks=hooks,
                          seed=seed)  # fmt: skip
    gens = (
        greedy_generate(
            model,
            list(prompts),
            intervention=iv,
            stop_at_newline=False,
            decoding=DecodeOptions(max_new_tokens=max_new_tokens),
        )
        if prompts
        else []
    )
    nll = {hl: _kept(hl, *line_nll(model, s, fwd_hooks=hooks, max_tokens=max_tokens))
           for hl, s in heldout.items()}  # fmt: skip
    return {"bos": bos, "prompt": gens, "nll": nll}


def _outputs_stacked(
    model: Model, ivs: Sequence[Intervention | None], heldout: Mapping[str, Sequence[str]], *,
    n_samples: int, max_new_tokens: int, prompts: Sequence[str], seed: int,
    max_tokens: int | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`_outputs_one` of every arm, the arms stacked in passes of at most
    :data:`MAX_STACKED_ROWS` BOS rows (:mod:`mechlingo.analyses.experts.stacked`)."""
    per = max(1, MAX_STACKED_ROWS // n_samples)
    out: list[dict[str, Any]] = []
    for i in range(0, len(ivs), per):
        part = list(ivs[i : i + per])
        hooks = [intervention_hooks(model, iv) for iv in part]
        bos = stacked_bos_samples(model, hooks, n_samples, max_new_tokens=max_new_tokens,
                                  seed=seed)  # fmt: skip
        gens = (generate_conditions(model, list(prompts), part, stop_at_newline=False, decoding=DecodeOptions(max_new_tokens=max_new_tokens))[0] if prompts
                else [[] for _ in part])  # fmt: skip
        nll = {hl: stacked_line_nll(model, s, hooks, max_tokens=max_tokens)
               for hl, s in heldout.items()}  # fmt: skip
        out += [{"bos": bos[c], "prompt": gens[c],
                 "nll": {hl: _kept(hl, *v[c]) for hl, v in nll.items()}}
                for c in range(len(part))]  # fmt: skip
    return out


def _arm_outputs(
    model: Model, todo: Sequence[_Arm], heldout: Mapping[str, Sequence[str]], stack: bool,
    opts: dict[str, Any], turn: int = 0,
) -> list[dict[str, Any]]:  # fmt: skip
    """The outputs of the arms ``todo`` (stacked or one run each); inside
    :func:`~mechlingo.core.distributed.sharded_scoring` under torchrun each rank runs
    an equal contiguous share of the arms (rank ``r`` the ``(r + turn) % world``-th share, so
    the larger shares move with ``turn``) and every rank gets all of them, in order."""
    if scoring_sharded():
        info = dist_info()
        idx = list(shard_bounds(len(todo), (info.rank + turn) % info.world_size, info.world_size))
    else:
        idx = list(range(len(todo)))
    mine = [todo[i] for i in idx]
    sharded = scoring_sharded()
    with sharded_scoring(False):  # a rank's own arms: no collective inside
        if stack and len(mine) > 1:
            outs = _outputs_stacked(model, [a.iv for a in mine], heldout, **opts)
        else:
            outs = [_outputs_one(model, a.iv, heldout, **opts) for a in mine]
    if not sharded:
        return outs
    got = dict(gather_lists(list(zip(idx, outs, strict=True))))
    return [got[i] for i in range(len(todo))]


def _run_arms(
    model: Model, lang: str, todo: Sequence[_Arm], id_langs: Sequence[str],
    heldout: Mapping[str, Sequence[str]], base_nll: dict[str, Tensor] | None, stack: bool,
    opts: dict[str, Any], turn: int = 0,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """``{arm name: {"row": the KCurve row, "nll": {lang: per-line NLL}}}`` of the arms
    ``todo``, stacked in one pass (``stack``) or one run each; the ratios are against
    ``base_nll`` (the no-clamp arm's, from ``todo`` when it is among them)."""
    outs = _arm_outputs(model, todo, heldout, stack, opts, turn)
    for a, o in zip(todo, outs, strict=True):
        if a.arm == "none":
            base_nll = {hl: v[0].double() for hl, v in o["nll"].items()}
    res = {}
    for a, o in zip(todo, outs, strict=True):
        gen = _rates(lang, o["bos"], o["prompt"], opts["prompts"], id_langs)
        ppl = _ppl_columns(o["nll"], None if a.arm == "none" else base_nll, opts["seed"])
        hits, examples = gen.pop("bos_hits"), gen.pop("examples")
        seed_col = {} if a.control_seed is None else {"control_seed": a.control_seed}
        row = {"k": a.k, "arm": a.arm, **seed_col, **gen, **ppl, "bos_hits": hits,
               "examples": examples}  # fmt: skip
        res[a.name] = {"row": row, "nll": {hl: v[0].tolist() for hl, v in o["nll"].items()}}
    return res


@dataclass(frozen=True)
class KCurveOptions:
    """How :func:`k_curve` samples, clamps and measures (its defaults are these), checked
    when made.

    Attributes:
        n_samples: samples from a bare BOS prompt per arm.
        max_new_tokens: greedy tokens per BOS sample and per neutral prompt.
        prompts: the neutral prompts whose greedy continuations give ``target_rate_prompt``.
        value: the clamp value, the ``"mean"`` or ``"median"`` pooled activation.
        seed: the seed of the samples and of the random control's neuron set.
        control: run the random-neuron control arm.
        control_seeds: a population of random controls, one clamp per seed (``None``: one,
            of ``seed``).
        layer_matched: draw the control's neurons per layer as the experts lie.
        max_tokens: tokens per held-out line kept for perplexity (``None``: all).
        progress: show a progress bar over the arms.
        stack: run every arm in one batched pass (``False``: one run per arm).
        shard_turn: under torchrun, rank ``r`` runs the ``(r + shard_turn) % world``-th
            share of the arms (the later shares are the larger of an uneven split): two curves
            run with turns 0 and 1 put the odd arm of each on other ranks. The rows do not
            depend on it.
    """

    n_samples: int = 32
    max_new_tokens: int = SAMPLE_NEW_TOKENS
    prompts: Sequence[str] = NEUTRAL_PROMPTS
    value: Literal["mean", "median"] = "mean"
    seed: int = SEED
    control: bool = True
    control_seeds: Sequence[int] | None = None
    layer_matched: bool = False
    max_tokens: int | None = 32
    progress: bool = PROGRESS
    stack: bool = True
    shard_turn: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.n_samples, int) or self.n_samples < 1:
            raise ExpertError(f"n_samples must be >= 1, got {self.n_samples}")
        if self.value not in ("mean", "median"):
            raise ExpertError(f"value {self.value!r}: pass one of mean, median")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ExpertError(
                f"max_tokens must be at least 1 (or None: all), got {self.max_tokens}"
            )


def k_curve(
    model: Model,
    experts: ExpertResult,
    lang: str,
    ks: Sequence[int],
    heldout: Mapping[str, Sequence[str]],
    options: KCurveOptions | None = None,
    *,
    checkpoint: Callable[[str, Callable[[], dict]], dict] | None = None,
) -> KCurve:
    """For each ``k``: language of generations with the clamp on and held-out perplexity of
    every language, for the experts, the random control, and no clamp (``k = 0``), with
    Wilson intervals for the rates and bootstrap intervals (over lines) for perplexities.

    The language of each generation is identified by py3langid among the languages of
    ``heldout`` and ``experts.langs``; generations with no letters count as not in the target.
    Choose ``k`` from the result with :meth:`KCurve.choose` (the papers' rule).

    The random control is one random-neuron clamp per ``k`` (its neuron set drawn with
    ``seed``), or with ``control_seeds`` a population: one clamp per seed, each a row with
    ``arm == "random"`` and its ``control_seed`` (``layer_matched``: the neurons drawn per
    layer as the experts lie, :meth:`ExpertResult.random_features`). ``control=False``: no
    random arm. With ``stack`` every arm runs in one batched pass (each clamp acting on its
    own copy of the inputs, :mod:`mechlingo.analyses.experts.stacked`: the same numbers as one
    run per arm up to float rounding); ``stack=False`` runs them one by one.

    ``checkpoint(name, fn)``, when given, runs each arm (``name``: ``"none"``, ``"k50-experts"``,
    ``"k50-random"``, ``"k50-random_s3"``...) and returns ``fn()`` (a JSON-able dict) or a
    stored equal result (a resumable checkpoint, :class:`mechlingo.core.checkpoints.Checkpoints`; ``experts
    --resume``); the first arm not stored computes every later one with it. Every arm draws
    its samples with ``seed`` alone, so an arm's row does not depend on the other ``ks``.
    The settings named here are ``options``' (:class:`KCurveOptions`, its defaults when
    ``None``).
    """

    o = KCurveOptions() if options is None else options
    if not ks:
        raise ExpertError("give at least one k")
    id_langs = list(dict.fromkeys([*experts.langs, *heldout]))
    check_texts(heldout, 1, error=ExpertError)
    seeds = o.control_seeds if o.control else ()
    arms = _k_arms(experts, lang, ks, o.value, seeds, o.layer_matched, o.seed)
    run = checkpoint or (lambda name, fn: fn())
    opts = {"n_samples": o.n_samples, "max_new_tokens": o.max_new_tokens, "prompts": o.prompts,
            "seed": o.seed, "max_tokens": o.max_tokens}  # fmt: skip
    stored: dict[str, dict] = {}
    done: dict[str, dict] = {}
    base: list[dict[str, Tensor] | None] = [None]

    def compute(a: _Arm) -> dict:
        if a.name not in done:
            todo = [b for b in arms if b.name not in stored] if o.stack else [a]
            done.update(_run_arms(model, lang, todo, id_langs, heldout, base[0], o.stack, opts,
                                  o.shard_turn))  # fmt: skip
        return done[a.name]

    rows = []
    for a in tqdm(arms, desc="k curve", disable=not o.progress):
        out = stored[a.name] = run(a.name, lambda a=a: compute(a))
        if a.arm == "none":
            base[0] = {hl: torch.tensor(v, dtype=torch.float64) for hl, v in out["nll"].items()}
        rows.append(out["row"])
    return KCurve(lang, rows)

"""What else does an intervention change? A language x measure side-effects matrix.

A steering vector that raises Spanish recall, or a Spanish expert clamp that aligns
embeddings, can also change the other languages. :func:`side_effects` measures, for every
language, with and without the intervention in one run, the change in ``accuracy`` (greedy,
on facts), ``perplexity`` (relative, on text lines) and ``output_lang`` (the share of
continuations identified as the line's own language), each with a paired bootstrap interval,
against :func:`random_control`: the intervention's shape and size with no learnt direction.
A change that the control also shows is the price of any push of that size. Definitions and
the control of each kind: ``docs/methods/repair-vectors.md`` ("Side effects")."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.likelihood import line_nll
from mechlingo.core.defaults import BATCH_SIZE, MAX_NEW_TOKENS, PROGRESS, SEED
from mechlingo.core.errors import InputError
from mechlingo.core.faults import derive_seed
from mechlingo.core.jsonable import jsonable
from mechlingo.core.languages import writes_spaces
from mechlingo.core.sites import resolve_site, site_map
from mechlingo.core.types import Model
from mechlingo.data.langid import identify_languages
from mechlingo.interventions import (
    Ablation,
    Compose,
    Intervention,
    NeuronClamp,
    SteeringVector,
    intervention_hooks,
    random_like,
)
from mechlingo.kernels.significance import paired_bootstrap, wilson
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_facts, greedy_generate
from mechlingo.viz.side_effects import side_effects_heatmap

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from mechlingo.data import Fact

__all__ = [
    "MEASURES",
    "SideEffectOptions",
    "SideEffects",
    "SideEffectsError",
    "random_control",
    "side_effects",
]

#: The side-effect measures of the matrix, in column order (not the scoring metrics of
#: :data:`mechlingo.scoring.scorers.METRICS`).
MEASURES: tuple[str, ...] = ("accuracy", "perplexity", "output_lang")


class SideEffectsError(InputError):
    """Bad input to a side-effects measurement (the message says what to change)."""


# --------------------------------------------------------------------------------------
# The norm-matched random control
# --------------------------------------------------------------------------------------


def random_control(intervention: Intervention, model: Model, *, seed: int = SEED) -> Intervention:
    """A random intervention of the same shape and size as ``intervention`` (see the module
    docstring for each kind); deterministic for a given ``seed``.

    Raises:
        SideEffectsError: an intervention kind without a defined control (pass your own
            ``control=`` to :func:`side_effects`).
    """
    meta = {"control_of": repr(intervention), "seed": seed}
    if isinstance(intervention, Compose):
        return Compose(
            [
                random_control(p, model, seed=derive_seed(seed, "part", i))
                for i, p in enumerate(intervention.parts)
            ],
            meta=meta,
        )
    if isinstance(intervention, SteeringVector):
        if intervention.layer is None:
            raise SideEffectsError("the steering vector has no layer; place it with .at(layer)")
        v = intervention.direction(model)
        return SteeringVector(
            random_like(v, seed=seed),
            intervention.layer,
            intervention.alpha,
            site=intervention.site,
            positions=intervention.positions,
            meta=meta,
        )
    if isinstance(intervention, NeuronClamp):
        neurons: dict[int, Tensor] = {}
        for layer, ids in intervention.neurons.items():
            width = resolve_site(model, intervention.site, layer).width
            free = torch.ones(width, dtype=torch.bool)
            free[ids] = False
            pool = free.nonzero().flatten()
            if pool.numel() < ids.numel():
                raise SideEffectsError(
                    f"layer {layer}: {ids.numel()} clamped neurons leave too few others "
                    f"({pool.numel()}) for a random control; pass control="
                )
            # one generator per layer: a layer's pick does not depend on the other layers
            gen = torch.Generator().manual_seed(derive_seed(seed, "layer", layer))
            neurons[layer] = pool[torch.randperm(pool.numel(), generator=gen)[: ids.numel()]]
        return NeuronClamp(
            neurons,
            {layer: intervention.values[layer] for layer in neurons},
            intervention.mode,
            positions=intervention.positions,
            site=intervention.site,
            meta=meta,
        )
    if isinstance(intervention, Ablation):
        if intervention.mean is not None:
            return Ablation(
                intervention.site,
                intervention.layer,
                "mean",
                mean=random_like(intervention.mean, seed=seed),
                positions=intervention.positions,
                meta=meta,
            )
        n = site_map(model).n_layers
        own = intervention.layer % n
        others = [layer for layer in range(n) if layer != own]
        if not others:
            raise SideEffectsError("a one-layer model has no other layer for the control")
        gen = torch.Generator().manual_seed(seed)
        pick = others[int(torch.randint(len(others), (1,), generator=gen))]
        return Ablation(
            intervention.site, pick, "zero", positions=intervention.positions, meta=meta
        )
    raise SideEffectsError(
        f"no random control is defined for a {type(intervention).__name__}; pass control= "
        "(an intervention of the same size) or control=None"
    )


@dataclass
class SideEffects:
    """The side-effects matrix of one intervention (and its control).

    Attributes:
        rows: one dict per (arm, language, measure): ``arm`` (``"intervention"`` or
            ``"control"``), ``lang``, ``measure`` (one of :data:`MEASURES`), ``base`` (value
            without any intervention), ``value`` (with the arm's intervention), ``delta``
            (the change: a difference of shares for ``accuracy`` and ``output_lang``, the
            relative change ``value / base - 1`` for ``perplexity``), ``ci_low``/``ci_high``
            (bootstrap interval of ``delta``), ``value_ci_low``/``value_ci_high`` (Wilson
            interval of a share; NaN for perplexity) and ``n`` (facts or lines).
        langs: languages, in row order.
        meta: the intervention, the control, the settings and the confidence level.
        examples: per (arm, language), a few continuations and their identified language.
    """

    rows: list[dict[str, Any]]
    langs: list[str]
    meta: dict[str, Any] = field(default_factory=dict)
    examples: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (arm, language, measure)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def get(self, lang: str, measure: str, arm: str = "intervention") -> dict[str, Any]:
        """The row of one cell of the matrix."""
        for r in self.rows:
            if r["lang"] == lang and r["measure"] == measure and r["arm"] == arm:
                return r
        raise KeyError(f"no row for lang={lang!r}, measure={measure!r}, arm={arm!r}")

    def matrix(self, arm: str = "intervention", value: str = "delta") -> pd.DataFrame:
        """``[language x measure]`` table of ``value`` (``delta``, ``base``, ``value``, ...)."""
        df = self.to_dataframe()
        df = df[df["arm"] == arm]
        return df.pivot(index="lang", columns="measure", values=value).reindex(
            index=self.langs, columns=[m for m in MEASURES if m in set(df["measure"])]
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN as ``None``): ``langs``, ``measures``, ``rows``, ``meta``
        and ``examples`` -- what ``summary.json["side_effects"]`` holds."""
        return jsonable(
            {
                "langs": self.langs,
                "measures": list(MEASURES),
                "rows": self.rows,
                "meta": self.meta,
                "examples": self.examples,
            }
        )

    def fig_heatmap(self, arms: Sequence[str] | None = None) -> go.Figure:
        """Language x measure heatmaps of the change (one panel per arm: intervention and
        control), colour = change (red = up, blue = down), text = change and its interval.
        Perplexity is a relative change, the others differences of shares
        (:func:`mechlingo.viz.side_effects.side_effects_heatmap`)."""
        return side_effects_heatmap(
            self.rows,
            self.langs,
            MEASURES,
            arms=arms,
            intervention=self.meta.get("intervention", "the intervention"),
            confidence=self.meta.get("confidence", 0.95),
        )

    def _repr_html_(self) -> str:
        m = self.matrix()
        return "<b>SideEffects</b> (intervention, change)" + m.to_html(float_format="%.3f")


# --------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------


def _nan(x: float | None) -> float:
    """An undefined bound (``None``) as NaN, the matrix's marker for "no interval"."""
    return float("nan") if x is None else x


def _boot_ci(
    samples: tuple[np.ndarray, ...], statistic: Any, *, n_boot: int, level: float, seed: int
) -> tuple[float, float]:
    """The bounds of :func:`mechlingo.kernels.significance.paired_bootstrap` (NaN for fewer
    than two items)."""
    iv = paired_bootstrap(samples, statistic, n_resamples=n_boot, confidence=level, seed=seed)
    return _nan(iv.lo), _nan(iv.hi)


def _mean_diff(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(b, axis=axis) - np.mean(a, axis=axis)


def _ppl_ratio(a: np.ndarray, b: np.ndarray, n: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.expm1((np.sum(b, axis=axis) - np.sum(a, axis=axis)) / np.sum(n, axis=axis))


def _share_row(
    arm: str, lang: str, measure: str, base: np.ndarray, new: np.ndarray, opts: dict[str, Any]
) -> dict[str, Any]:
    n = len(base)
    lo, hi = _boot_ci((base, new), _mean_diff, **opts)
    w = wilson(int(new.sum()), n, confidence=opts["level"])
    vlo, vhi = _nan(w.lo), _nan(w.hi)
    return {
        "arm": arm,
        "lang": lang,
        "measure": measure,
        "base": float(base.mean()),
        "value": float(new.mean()),
        "delta": float(new.mean() - base.mean()),
        "ci_low": lo,
        "ci_high": hi,
        "value_ci_low": vlo,
        "value_ci_high": vhi,
        "n": n,
    }


def _ppl_row(
    arm: str, lang: str, base: np.ndarray, new: np.ndarray, count: np.ndarray, opts: dict
) -> dict[str, Any]:
    tot = float(count.sum())
    b, v = math.exp(float(base.sum()) / tot), math.exp(float(new.sum()) / tot)
    lo, hi = _boot_ci((base, new, count), _ppl_ratio, **opts)
    return {
        "arm": arm,
        "lang": lang,
        "measure": "perplexity",
        "base": b,
        "value": v,
        "delta": v / b - 1.0,
        "ci_low": lo,
        "ci_high": hi,
        "value_ci_low": float("nan"),
        "value_ci_high": float("nan"),
        "n": len(base),
    }


# --------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------


def line_prefix(line: str, lang: str, *, words: int = 6, chars: int = 12) -> str:
    """The start of a line used as a continuation prompt: its first ``words`` words, or its
    first ``chars`` characters in languages written without spaces (zh, ja, th, ...:
    :func:`~mechlingo.core.languages.writes_spaces`)."""
    line = line.strip()
    if not writes_spaces(lang):
        return line[:chars]
    return " ".join(line.split()[:words])


def _languages_and_lines(
    facts: Sequence[Fact],
    lines_by_lang: Mapping[str, Sequence[str]],
    langs: Sequence[str] | None,
) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """Every language given (facts first, then lines), the languages to report, and the
    non-empty lines of each reported language that has lines.

    Raises:
        SideEffectsError: lines that are not a mapping, a reported language with neither
            facts nor lines, no language at all, or a language whose lines are all empty.
    """
    if not isinstance(lines_by_lang, Mapping):
        raise SideEffectsError("lines_by_lang must be a mapping {lang: [line, ...]}")
    order = list(dict.fromkeys([*(f.lang for f in facts), *lines_by_lang]))
    langs = list(langs) if langs is not None else order
    unknown = [lg for lg in langs if lg not in order]
    if unknown:
        raise SideEffectsError(f"no facts and no lines for language(s) {unknown}")
    if not langs:
        raise SideEffectsError("no languages to measure: give facts or lines")
    lines = {lg: [s for s in lines_by_lang[lg] if s.strip()] for lg in langs if lg in lines_by_lang}
    empty = [lg for lg, v in lines.items() if not v]
    if empty:
        raise SideEffectsError(f"language(s) {empty} have no non-empty lines")
    return order, langs, lines


def _measure_arm(
    model: Model,
    intervention: Intervention | None,
    facts: Sequence[Fact],
    lines: Mapping[str, Sequence[str]],
    prompts: Mapping[str, Sequence[str]],
    id_langs: Sequence[str],
    opts: SideEffectOptions,
) -> dict[str, Any]:
    """One arm's raw measurements: ``correct`` (per fact, or None without facts), per
    language the per-line ``nll`` and token ``counts``, ``own`` (per continuation of
    ``prompts``: in the line's own language?) and ``examples``."""
    out: dict[str, Any] = {"correct": None, "nll": {}, "counts": {}, "own": {}, "examples": {}}
    if facts:
        ev = evaluate_facts(
            model,
            list(facts),
            intervention=intervention,
            decoding=DecodeOptions(max_new_tokens=opts.max_new_tokens, batch_size=opts.batch_size),
        )
        out["correct"] = np.array([bool(r["correct"]) for r in ev.records], dtype=float)
    hooks = intervention_hooks(model, intervention)
    for lg, v in lines.items():
        s, c = line_nll(
            model, v, fwd_hooks=hooks, batch_size=opts.batch_size, max_tokens=opts.max_tokens
        )
        out["nll"][lg] = s.numpy()
        out["counts"][lg] = c.numpy().astype(float)
    flat = [p for lg in prompts for p in prompts[lg]]
    if not flat:
        return out
    gens = greedy_generate(
        model,
        flat,
        intervention=intervention,
        stop_at_newline=False,
        decoding=DecodeOptions(max_new_tokens=opts.continuation_tokens, batch_size=opts.batch_size),
    )
    ids = identify_languages(gens, id_langs)
    k = 0
    for lg, ps in prompts.items():
        got, cont = ids[k : k + len(ps)], gens[k : k + len(ps)]
        out["own"][lg] = np.array([x == lg for x in got], dtype=float)
        out["examples"][lg] = [
            {"prompt": p, "continuation": g, "lang": x}
            for p, g, x in list(zip(ps, cont, got, strict=True))[: opts.n_examples]
        ]
        k += len(ps)
    return out


def _effect_rows(
    measured: Mapping[str, Mapping[str, Any]],
    langs: Sequence[str],
    fact_langs: Sequence[str],
    opts: dict[str, Any],
) -> list[dict[str, Any]]:
    """The matrix rows: per non-base arm and language, the change of each measure against the
    ``base`` arm with its intervals."""
    fact_lang = np.array(fact_langs)
    base = measured["base"]
    rows: list[dict[str, Any]] = []
    for arm, m in measured.items():
        if arm == "base":
            continue
        for lg in langs:
            sel = fact_lang == lg
            if m["correct"] is not None and sel.any():
                rows.append(
                    _share_row(arm, lg, "accuracy", base["correct"][sel], m["correct"][sel], opts)
                )
            if lg in m["nll"]:
                count = base["counts"][lg]
                rows.append(_ppl_row(arm, lg, base["nll"][lg], m["nll"][lg], count, opts))
            if lg in m["own"]:
                rows.append(_share_row(arm, lg, "output_lang", base["own"][lg], m["own"][lg], opts))
    return rows


@dataclass(frozen=True)
class SideEffectOptions:
    """The settings of :func:`side_effects` (its defaults are these; their meaning is in its
    docstring), checked when made; ``side_effects(..., options=options)`` applies them."""

    seed: int = SEED
    max_new_tokens: int = MAX_NEW_TOKENS
    continuation_tokens: int = 16
    prefix_words: int = 6
    max_tokens: int | None = 48
    batch_size: int = BATCH_SIZE
    n_boot: int = 1000
    confidence: float = 0.95
    n_examples: int = 3
    progress: bool = PROGRESS

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "continuation_tokens", "prefix_words", "batch_size",
                     "n_boot"):  # fmt: skip
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SideEffectsError(
                    f"side effects: {name} must be an integer of at least 1, got {v!r}"
                )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise SideEffectsError(
                f"side effects: max_tokens must be at least 1 (or None), got {self.max_tokens}"
            )
        if not 0 < self.confidence < 1:
            raise SideEffectsError(
                f"side effects: confidence must be between 0 and 1, got {self.confidence}"
            )
        if self.n_examples < 0:
            raise SideEffectsError(f"side effects: n_examples must be >= 0, got {self.n_examples}")

    def kw(self) -> dict[str, Any]:
        """The settings as a dict (their names are the fields)."""
        return asdict(self)


def side_effects(
    model: Model,
    intervention: Intervention,
    facts: Sequence[Fact],
    lines_by_lang: Mapping[str, Sequence[str]],
    *,
    control: Intervention | str | None = "random",
    langs: Sequence[str] | None = None,
    options: SideEffectOptions | None = None,
) -> SideEffects:
    """Measure what ``intervention`` changes in every language (see the module docstring).

    Args:
        model: a TransformerLens model.
        intervention: any intervention (a saved one: :func:`mechlingo.interventions.
            load_intervention`).
        facts: facts of any languages (accuracy per language; languages without facts get no
            accuracy row).
        lines_by_lang: ``{lang: [line, ...]}`` text lines (e.g. NTREX dev via
            :func:`mechlingo.data.read_parallel_dir`) for perplexity and the continuations.
        control: ``"random"`` (:func:`random_control`, seeded by ``seed``), an intervention of
            your own, or ``None`` (no control arm).
        langs: languages to report (default: those of the facts, then of the lines).
        options: the settings (:class:`SideEffectOptions`; its defaults when ``None``):
        seed: the control's and the bootstrap's seed.
        max_new_tokens: greedy tokens for the facts' eval rule.
        continuation_tokens: greedy tokens continuing each line's first ``prefix_words`` words.
        max_tokens: tokens per line kept for perplexity (``None`` = all).
        n_boot, confidence: bootstrap resamples and interval level.
        batch_size, n_examples, progress: texts per pass, continuations kept per language
            and arm, a progress bar over the arms.

    Returns:
        A :class:`SideEffects`: ``.to_dataframe()``, ``.to_json()``, ``.fig_heatmap()``.
    """
    o = SideEffectOptions() if options is None else options
    facts = list(facts)
    order, langs, lines = _languages_and_lines(facts, lines_by_lang, langs)
    facts = [f for f in facts if f.lang in set(langs)]
    if control == "random":
        control = random_control(intervention, model, seed=o.seed)
    elif isinstance(control, str):
        raise SideEffectsError(f"control must be 'random', an intervention or None: {control!r}")
    arms: list[tuple[str, Intervention | None]] = [("base", None), ("intervention", intervention)]
    if control is not None:
        arms.append(("control", control))
    id_langs = order  # every language given, not only those reported
    prompts = {lg: [line_prefix(s, lg, words=o.prefix_words) for s in v] for lg, v in lines.items()}
    measured = {
        arm: _measure_arm(
            model,
            iv,
            facts,
            lines,
            prompts if len(id_langs) > 1 else {},
            id_langs,
            o,
        )
        for arm, iv in tqdm(arms, desc="side effects", disable=not o.progress)
    }
    opts = {"n_boot": o.n_boot, "level": o.confidence, "seed": o.seed}
    rows = _effect_rows(measured, langs, [f.lang for f in facts], opts)
    return SideEffects(
        rows=rows,
        langs=langs,
        meta={
            "intervention": repr(intervention),
            "control": None if control is None else repr(control),
            "seed": o.seed,
            "confidence": o.confidence,
            "n_boot": o.n_boot,
            "max_new_tokens": o.max_new_tokens,
            "continuation_tokens": o.continuation_tokens,
            "prefix_words": o.prefix_words,
            "max_tokens": o.max_tokens,
            "id_langs": id_langs,
        },
        examples={arm: m["examples"] for arm, m in measured.items()},
    )

"""The two repair vectors of Lu et al. (2025): building them and scoring fixed conditions.

* **task** (recall engagement): the mean last-token ``resid_pre`` over few-shot recall prompts
  minus the zero-shot mean (``subtract_zero_shot=False`` keeps the plain few-shot mean);
* **diff** (back-translation): the mean over explicit translation prompts ("English:
  Rome\nFrench:") minus the zero-shot mean.

:func:`build_steering_vectors` gives both as ``[n_layers, d_model]`` stacks
(:class:`SteeringPair` of :class:`~mechlingo.interventions.SteeringVector`; place one with
``.at(layer, alpha)``). By default (``unit="resid"``) each row is scaled to the mean last-token
residual norm at its layer, so ``alpha`` is a fraction of a typical residual there; the unit is
recorded in ``build["unit"]``, every saved vector and the summary. :func:`score_at_config`
scores fixed conditions at one config (a quick look); the protocol that chooses on dev is
:mod:`mechlingo.analyses.recall.steer_eval`. The method: ``docs/methods/repair-vectors.md``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.activations.runs import last_token_means
from mechlingo.analyses.recall.settings import BuildSettings
from mechlingo.core.defaults import (
    CONTROL_SEEDS,
    PROGRESS,
    SEED,
    STEER_BATCH_SIZE,
    STEER_MAX_NEW_TOKENS,
)
from mechlingo.core.errors import ArtifactError, InputError
from mechlingo.core.faults import derive_seed
from mechlingo.core.jsonable import jsonable
from mechlingo.core.types import Model
from mechlingo.core.untrusted import check_links, read_json, refuse_special
from mechlingo.data import Fact, few_shot_prompt, translation_prompt
from mechlingo.interventions import (
    Compose,
    Intervention,
    SteeringVector,
    load_intervention,
    model_info,
    random_like,
)
from mechlingo.scoring.evaluate import DecodeOptions, EvalResult, evaluate_facts
from mechlingo.viz.common import html_summary, interval_text
from mechlingo.viz.evaluate import accuracy_bars

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "CONDITIONS",
    "SteeringPair",
    "SteeringConfig",
    "build_steering_vectors",
    "score_facts",
    "conditions",
    "random_steering",
    "CONTROLS",
    "population_names",
    "protocol_conditions",
    "score_at_config",
    "lowest_above_zero",
    "relative_gain",
    "vectors_from_means",
]

CONDITIONS = ("orig", "task", "diff", "both", "random")


# --------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------


def steering_prompts(
    facts: Sequence[Fact],
    *,
    pool: Sequence[Fact] | None = None,
    k_shot: int = BuildSettings.k_shot,
    seed: int = 0,
    translation_shots: int = BuildSettings.translation_shots,
) -> dict[str, list[str]]:
    """The three prompt sets the vectors are built from (``k_shot`` and
    ``translation_shots`` default to :class:`~mechlingo.analyses.recall.settings.BuildSettings`',
    the settings ``mechlingo steer build`` uses).

    * ``few_shot``: ``k_shot`` solved demonstrations (same relation and language, from
      ``pool``) then the query;
    * ``zero_shot``: the fact's own prompt;
    * ``translation``: "English: <answer_en>\\n<Language>:" for non-English facts, after
      ``translation_shots`` solved translation pairs of other facts from ``pool``.
    """
    pool = list(pool) if pool is not None else list(facts)
    few, zero, trans = [], [], []
    for f in facts:
        zero.append(f.prompt)
        try:
            few.append(few_shot_prompt(f, pool, k=k_shot, seed=seed))
        except ValueError:
            pass  # too few demonstrations for this relation/language in the pool
        if f.lang != "en" and f.answer_en:
            try:
                trans.append(
                    translation_prompt(f, src="en", k=translation_shots, pool=pool, seed=seed)
                )
            except ValueError:
                pass  # too few demonstrations for this language in the pool
    if not few:
        raise InputError(
            f"no few-shot prompt could be built: the pool needs at least {k_shot + 1} facts per "
            "relation and language"
        )
    if not trans:
        raise InputError("no translation prompts: the build facts need non-English languages")
    return {"few_shot": few, "zero_shot": zero, "translation": trans}


@dataclass
class SteeringPair:
    """The recall-engagement (task) and back-translation (diff) vector stacks.

    Attributes:
        task: ``SteeringVector`` holding ``[n_layers, d_model]``; place with ``.at(l, a)``.
        diff: same for the back-translation vector.
        means: the float32 ``[n_layers, d_model]`` mean last-token residuals it was built from
            (``few_shot``, ``zero_shot``, ``translation``).
        build: how it was built (prompt counts, languages, relations, options, ``unit``:
            what ``alpha`` is measured in, ``raw_norms``, ``resid_norm``).
    """

    task: SteeringVector
    diff: SteeringVector
    means: dict[str, Tensor] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        n_layers = int(self.task.vector.shape[0]) if self.task.vector.ndim == 2 else 1
        return (
            f"SteeringPair(task and diff stacks over {n_layers} layers, "
            f"{self.build.get('n_facts', '?')} facts in {self.build.get('langs', '?')}, "
            f"unit {self.build.get('unit', '?')})"
        )

    def _repr_html_(self) -> str:
        """Per vector its norm per layer (median and range over layers) and the prompts it
        was built from."""
        rows = []
        for name, sv in (("task", self.task), ("diff", self.diff)):
            norms = sv.vector.float().reshape(-1, sv.vector.shape[-1]).norm(dim=-1)
            q = torch.quantile(norms, torch.tensor([0.0, 0.5, 1.0]))
            rows.append({"vector": name, "layers": int(norms.numel()),
                         "norm: median [min, max]": interval_text(*(float(v) for v in q))})  # fmt: skip
        counts = self.build.get("n_prompts", {})
        note = ", ".join(f"{k}: {v} prompts" for k, v in counts.items())
        return html_summary(repr(self), rows, note)

    @property
    def relations(self) -> list[str] | None:
        """The relations the vectors were built from (``None`` for artifacts saved before
        they were recorded)."""
        rel = self.build.get("relations")
        return None if rel is None else list(rel)

    @property
    def unit(self) -> str:
        """What ``alpha`` is measured in: ``"resid"`` (fraction of the mean residual norm at
        the layer) or ``"raw"`` (the raw mean/difference). An :class:`ArtifactError` when
        ``build`` records no unit (a folder written before units existed)."""
        if "unit" not in self.build:
            raise ArtifactError(
                "these repair vectors record no unit (what alpha is measured in)",
                where="build.json",
                fix="rebuild them with `mechlingo steer build --out VDIR` (or "
                "build_steering_vectors)",
            )
        return str(self.build["unit"])

    def norms(self) -> dict[str, list[float]]:
        """Per-layer norms of each stack (the scale a given ``alpha`` multiplies)."""
        return {
            "task": self.task.vector.norm(dim=-1).tolist(),
            "diff": self.diff.vector.norm(dim=-1).tolist(),
        }

    def save(self, folder: str | Path, model: Model | None = None) -> Path:
        """``folder/task`` and ``folder/diff`` (each a saved intervention) + ``build.json``."""
        folder = Path(folder)
        self.task.save(folder / "task", model)
        self.diff.save(folder / "diff", model)
        (folder / "build.json").write_text(
            json.dumps(self.build, indent=2, ensure_ascii=False), encoding="utf-8"
        )
        return folder

    @classmethod
    def load(cls, folder: str | Path, model: Model | None = None) -> SteeringPair:
        """Load what :meth:`save` wrote; with ``model``, check that the vectors fit it."""
        folder = Path(folder)
        check_links(folder, ArtifactError)  # task/ or diff/ linked from elsewhere: refused
        task = load_intervention(folder / "task", model)
        diff = load_intervention(folder / "diff", model)
        if not isinstance(task, SteeringVector) or not isinstance(diff, SteeringVector):
            raise ArtifactError(f"{folder} does not hold two steering vectors")
        build_path = folder / "build.json"
        refuse_special(build_path, ArtifactError)
        build = read_json(build_path, ArtifactError, root=folder) if build_path.is_file() else {}
        if not isinstance(build, dict):
            raise ArtifactError(
                f"{build_path} does not hold a JSON object",
                fix=f"rebuild it with `mechlingo steer build --out {folder}`",
            )
        if "unit" not in build:
            raise ArtifactError(
                f"{folder} records no unit for its vectors (what alpha is measured in): it "
                "was written before units existed or its build.json is missing",
                where=str(build_path),
                fix=f"rebuild it with `mechlingo steer build --out {folder}`",
            )
        return cls(task, diff, {}, build)


UNITS = ("resid", "raw")
UNIT_TEXT = {
    "resid": "alpha is in units of the mean last-token residual norm at the layer (each stack "
    "row is the vector's direction scaled to that norm)",
    "raw": "alpha multiplies the raw vector (a mean or a difference of means)",
}


def vectors_from_means(
    means: dict[str, Tensor],
    resid_norm: Tensor | None,
    *,
    subtract_zero_shot: bool = True,
    unit: str = "resid",
    model: Model | None = None,
    build: dict[str, Any] | None = None,
) -> SteeringPair:
    """The two stacks from the three mean stacks (``few_shot``, ``zero_shot``,
    ``translation``, each ``[n_layers, d_model]``), in the given ``unit``.

    ``unit="resid"`` scales each row to ``resid_norm[layer]`` (the mean last-token residual
    norm there), so that ``alpha`` reads as "this fraction of a typical residual"; the same
    ``alpha`` then means the same relative push at every layer, and a random vector of the
    same norm (the control) is comparable. ``unit="raw"`` keeps the raw means/differences.
    """
    if unit not in UNITS:
        raise InputError(f"unit must be one of {UNITS}, got {unit!r}")
    few, zero, trans = (means[k].double() for k in ("few_shot", "zero_shot", "translation"))
    raw = {"task": (few - zero) if subtract_zero_shot else few, "diff": trans - zero}
    build = dict(build or {})
    build["subtract_zero_shot"] = subtract_zero_shot
    build["unit"] = unit
    build["unit_text"] = UNIT_TEXT[unit]
    build["raw_norms"] = {k: [round(x, 4) for x in stack_norm(v)] for k, v in raw.items()}
    stacks = dict(raw)
    if unit == "resid":
        if resid_norm is None:
            raise InputError('unit="resid" needs the residual norms (resid_norm)')
        rn = resid_norm.double().reshape(-1, 1)
        build["resid_norm"] = [round(float(x), 4) for x in rn.flatten()]
        # a row that is exactly 0 (e.g. few-shot minus zero-shot at layer 0, where both end in
        # the same token) stays 0 instead of being blown up to the residual norm
        stacks = {
            k: torch.where(n > 1e-6 * rn, v / n.clamp_min(1e-12) * rn, torch.zeros_like(v))
            for k, v in raw.items()
            for n in [v.norm(dim=-1, keepdim=True)]
        }
    info = model_info(model) if model is not None else None
    out = {}
    for name, v in stacks.items():
        meta = {"name": name, "build": build, "unit": unit}
        if info is not None:
            meta["model"] = info
        out[name] = SteeringVector(v.float().cpu(), None, 1.0, meta=meta)
    return SteeringPair(
        out["task"], out["diff"], {k: v.float().cpu() for k, v in means.items()}, build
    )


def build_steering_vectors(
    model: Model,
    facts: Sequence[Fact],
    settings: BuildSettings | None = None,
    *,
    pool: Sequence[Fact] | None = None,
    progress: bool = PROGRESS,
) -> SteeringPair:
    """Build both vector stacks from ``facts`` (one streaming pass per prompt set; the
    zero-shot pass also reads the residual norms), with ``settings``
    (:class:`~mechlingo.analyses.recall.settings.BuildSettings`: ``k_shot``,
    ``translation_shots``, ``subtract_zero_shot``, ``unit``, ``batch_size``).

    Args:
        facts: the build facts (their languages and relations are what the vectors are
            "built from"; apply them to others to test transfer).
        settings: how to build (``None``: the defaults). ``subtract_zero_shot`` (default):
            task = few-shot mean minus zero-shot mean, not the plain few-shot mean (which is
            about the mean residual itself; the dev comparison is in
            ``docs/methods/repair-vectors.md``). ``unit="resid"`` (default): each row scaled to
            the mean last-token residual norm at its layer; ``"raw"``: the raw difference.
            ``translation_shots``: solved translation pairs (other facts of ``pool``) before
            each translation prompt of the diff vector.
        pool: facts to draw few-shot demonstrations from (default ``facts``).

    Returns:
        :class:`SteeringPair`; ``task.vector`` and ``diff.vector`` are ``[n_layers, d_model]``,
        ``build`` records options, prompt counts, ``raw_norms`` and ``resid_norm``.
    """
    settings = settings or BuildSettings()
    facts = list(facts)
    t0 = time.time()
    k_shot, shots, batch_size = settings.k_shot, settings.translation_shots, settings.batch_size
    prompts = steering_prompts(facts, pool=pool, k_shot=k_shot, translation_shots=shots)
    read = {  # the zero-shot pass also reads the residual norms
        name: last_token_means(
            model, ps, batch_size=batch_size, progress=progress, norms=name == "zero_shot"
        )
        for name, ps in prompts.items()
    }
    means = {name: r.mean for name, r in read.items()}
    resid_norm = read["zero_shot"].norm
    build = {
        "n_prompts": {k: len(v) for k, v in prompts.items()},
        "langs": sorted({f.lang for f in facts}),
        "relations": sorted({f.relation for f in facts}),
        "n_facts": len({f.id for f in facts}),
        "k_shot": k_shot,
        "translation_shots": shots,
        "fact_ids": sorted({f.id for f in facts}),
        "site": "resid_pre",
        "positions": "last",
    }
    out = vectors_from_means(
        means,
        resid_norm,
        subtract_zero_shot=settings.subtract_zero_shot,
        unit=settings.unit,
        model=model,
        build=build,
    )
    out.build["seconds"] = round(time.time() - t0, 1)
    return out


# --------------------------------------------------------------------------------------
# Conditions
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SteeringConfig:
    """Where and how strongly each vector is applied (chosen on dev)."""

    task_layer: int
    task_alpha: float
    diff_layer: int
    diff_alpha: float

    def to_json(self) -> dict[str, Any]:
        return {
            "task_layer": self.task_layer,
            "task_alpha": self.task_alpha,
            "diff_layer": self.diff_layer,
            "diff_alpha": self.diff_alpha,
        }


def conditions(
    vectors: SteeringPair, config: SteeringConfig, *, seed: int = SEED, positions: Any = "last"
) -> dict[str, Intervention | None]:
    """The five conditions: ``orig`` (nothing), ``task``, ``diff``, ``both`` (task then diff)
    and ``random`` (random directions with the norms of task and diff at the same layers and
    scales, applied together: the control for "any push of this size")."""
    task = vectors.task.at(config.task_layer, config.task_alpha, positions=positions)
    diff = vectors.diff.at(config.diff_layer, config.diff_alpha, positions=positions)
    rand = random_steering(vectors, config, seed=seed, positions=positions)
    return {"orig": None, "task": task, "diff": diff, "both": task + diff, "random": rand}


def random_steering(
    vectors: SteeringPair,
    config: SteeringConfig,
    *,
    seed: int = SEED,
    selected: str = "both",
    positions: Any = "last",
) -> Compose:
    """The norm-matched random control of the ``selected`` vectors (``"task"``, ``"diff"`` or
    ``"both"``): for each, a random direction with the norm of its direction at its layer
    (:func:`~mechlingo.interventions.random_like`, seeded by ``seed`` and the vector's name),
    applied at the same layer and scale, all together (named ``random(task)``,
    ``random(diff)``)."""
    parts = []
    streams = {name: derive_seed(seed, name) for name in ("task", "diff")}
    for name, stack, layer, alpha in (
        ("task", vectors.task, config.task_layer, config.task_alpha),
        ("diff", vectors.diff, config.diff_layer, config.diff_alpha),
    ):
        if selected in (name, "both"):
            direction = random_like(stack.at(layer, alpha).direction(), streams[name])
            meta = {"name": f"random({name})"}
            parts.append(SteeringVector(direction, layer, alpha, positions=positions, meta=meta))
    return Compose(parts)


#: ``controls``: a random population for the selected condition only (``"selected"``, the
#: ``random_s<seed>`` conditions) or for each of task, diff and both (``"each"``).
CONTROLS = ("selected", "each")


def population_names(selected: str, pair: bool, controls: str = "each") -> dict[str, str]:
    """``{condition: prefix of its random population's conditions}``: with ``controls ==
    "each"`` one population per condition (``task``, ``diff`` and ``both``: random(task),
    random(diff) and both together, norm-matched at that condition's layer and scale; ``both``
    is the headline ``both_pair`` when dev chose a ``pair``), named ``random_<cond>_s<seed>``
    except the one that ``random_s<seed>`` (matched to ``selected`` at the chosen config)
    already is; with ``"selected"`` only ``{selected: "random_s"}``."""
    sel = selected if selected in ("task", "diff", "both") else "both"
    if controls == "selected":
        return {sel: "random_s"}
    return {c: "random_s" if c == sel and not (c == "both" and pair) else f"random_{c}_s"
            for c in ("task", "diff", "both")}  # fmt: skip


def protocol_conditions(
    vectors: SteeringPair,
    config: SteeringConfig,
    *,
    pair: SteeringConfig | None = None,
    selected: str = "both",
    seeds: Sequence[int] = CONTROL_SEEDS,
    controls: str = "selected",
) -> dict[str, Intervention | None]:
    """The test conditions of the repair protocol
    (:func:`mechlingo.analyses.recall.steer_eval.evaluate_test`): ``orig`` (nothing),
    ``task``, ``diff`` and ``both`` at ``config``; ``both_pair``, both vectors at dev's
    ``pair`` when it differs from ``config``; ``random_s<seed>``, the norm-matched random
    control of ``selected`` (``both`` unless ``task`` or ``diff``) for each seed; and, with
    ``controls == "each"``, the other random populations of :func:`population_names`."""
    task = vectors.task.at(config.task_layer, config.task_alpha)
    diff = vectors.diff.at(config.diff_layer, config.diff_alpha)
    conds: dict[str, Intervention | None] = {
        "orig": None,
        "task": task,
        "diff": diff,
        "both": task + diff,
    }
    if pair is not None and pair != config:
        conds["both_pair"] = vectors.task.at(pair.task_layer, pair.task_alpha) + (
            vectors.diff.at(pair.diff_layer, pair.diff_alpha)
        )
    sel = selected if selected in ("task", "diff", "both") else "both"
    for s in seeds:
        conds[f"random_s{s}"] = random_steering(vectors, config, selected=sel, seed=int(s))
    has_pair = "both_pair" in conds
    for c, prefix in population_names(sel, has_pair, controls).items():
        at = pair if (c == "both" and has_pair and pair is not None) else config
        for s in seeds if prefix != "random_s" else ():
            conds[f"{prefix}{s}"] = random_steering(vectors, at, selected=c, seed=int(s))
    return conds


# --------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------


def score_facts(
    model: Model,
    facts: Sequence[Fact],
    *,
    intervention: Intervention | None = None,
    max_new_tokens: int = STEER_MAX_NEW_TOKENS,
    batch_size: int = STEER_BATCH_SIZE,
    progress: bool = PROGRESS,
    metric: Any = "generate",
) -> EvalResult:
    """Accuracy on ``facts`` under ``metric`` (greedy generation by the eval rule by default;
    ``"rank"``, ``"klar"`` or a :class:`~mechlingo.scoring.scorers.Scorer`), through
    :func:`mechlingo.scoring.evaluate.evaluate_facts`."""
    return evaluate_facts(
        model,
        list(facts),
        intervention=intervention,
        metric=metric,
        decoding=DecodeOptions(
            max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress
        ),
    )


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


# --------------------------------------------------------------------------------------
# Evaluation on test
# --------------------------------------------------------------------------------------


def relative_gain(new: float, old: float) -> float:
    """``(new - old) / old``; ``inf`` when ``old`` is 0 and ``new`` is not, 0 when both are."""
    if old == 0:
        return 0.0 if new == 0 else float("inf")
    return (new - old) / old


def lowest_above_zero(orig: dict[str, float]) -> str | None:
    """The language with the lowest ``orig`` accuracy *among those above 0* (ties: the first
    in sorted order); ``None`` if every language is at 0.

    Languages at 0 are left out because a relative gain over 0 is undefined (and any single
    correct answer would be an "infinite" gain); their absolute gains are reported instead.

    This is *not* the card's lowest-language rule
    (:func:`mechlingo.analyses.recall.dev_grid.lowest_language_rule`), and answers another
    question: "on which of the scored languages is a relative gain defined and smallest",
    a description of one set of scored facts for :func:`score_at_config`'s quick look. The
    card's rule is fixed on dev (headroom: paired zero-shot and few-shot outcomes, ties
    pooled, never English) before test is scored; this one reads the accuracies it reports
    on, so it must not back a claim.
    """
    live = [lg for lg in sorted(orig) if orig[lg] > 0]
    return min(live, key=lambda lg: orig[lg]) if live else None


@dataclass
class ConditionResults:
    """Test results per condition.

    ``accuracy[condition][lang]``, ``english_rate[condition][lang]`` (answered with the
    English answer instead of the target-language one), ``lowest_language`` (lowest ``orig``
    accuracy among languages with ``orig`` > 0, see :func:`lowest_above_zero`; ``None`` when
    all are 0), ``relative_gain[condition]`` on that language, ``results`` (the raw
    :class:`~mechlingo.scoring.evaluate.EvalResult` per condition), ``unit``: what the config's
    alphas are measured in (see :func:`build_steering_vectors`).
    """

    accuracy: dict[str, dict[str, float]]
    english_rate: dict[str, dict[str, float]]
    lowest_language: str | None
    relative_gain: dict[str, float]
    results: dict[str, EvalResult]
    config: SteeringConfig
    unit: str = "raw"

    def absolute_gain(self) -> dict[str, dict[str, float]]:
        """``accuracy[c][lang] - accuracy["orig"][lang]`` for every condition and language."""
        orig = self.accuracy.get("orig", {})
        return {
            c: {lg: x - orig.get(lg, 0.0) for lg, x in acc.items()}
            for c, acc in self.accuracy.items()
        }

    def summary(self) -> dict[str, Any]:
        """JSON-ready headline numbers.

        ``lowest_language``: lowest ``orig`` accuracy among languages with ``orig`` > 0
        (languages at 0 are listed in ``zero_orig_languages``); ``relative_gain_lowest``:
        ``(both - orig) / orig`` there. ``absolute_gain[c][lang]`` and
        ``mean_absolute_gain[c]`` cover every language; ``english_effect[c]`` is the
        absolute change in English. ``alpha_unit`` says what the config's alphas mean.
        """

        gains = self.absolute_gain()
        orig = self.accuracy.get("orig", {})
        return {
            "accuracy": self.accuracy,
            "answered_in_english": self.english_rate,
            "mean_answered_in_english": {
                c: _mean(v for lg, v in r.items() if lg != "en")
                for c, r in self.english_rate.items()
            },
            "lowest_language": self.lowest_language,
            "lowest_language_rule": "lowest orig accuracy among languages with orig > 0",
            "zero_orig_languages": sorted(lg for lg, x in orig.items() if x == 0),
            "relative_gain_lowest": jsonable(self.relative_gain.get("both", 0.0)),
            "relative_gain_lowest_by_condition": {
                c: jsonable(g) for c, g in self.relative_gain.items()
            },
            "absolute_gain": gains,
            "mean_absolute_gain": {c: _mean(g.values()) for c, g in gains.items()},
            "english_effect": {c: g["en"] for c, g in gains.items() if "en" in g},
            "mean_accuracy": {c: _mean(a.values()) for c, a in self.accuracy.items()},
            "config": self.config.to_json(),
            "alpha_unit": self.unit,
            "alpha_unit_text": UNIT_TEXT.get(self.unit, ""),
        }

    def fig_accuracy(self, title: str = "Test accuracy per language and condition") -> go.Figure:
        """Grouped bars of the test accuracy per language, one colour per condition (the
        title gives the test facts per language when the raw results are held)."""
        n = [
            sum(r["lang"] == lg for r in res.records)
            for res in self.results.values()
            for lg in {r["lang"] for r in res.records}
        ]
        return accuracy_bars(self.accuracy, title, n=n or None)


def score_at_config(
    model: Model,
    vectors: SteeringPair,
    config: SteeringConfig,
    test_facts: Sequence[Fact],
    *,
    names: Sequence[str] = CONDITIONS,
    seed: int = SEED,
    max_new_tokens: int = STEER_MAX_NEW_TOKENS,
    batch_size: int = STEER_BATCH_SIZE,
    progress: bool = PROGRESS,
) -> ConditionResults:
    """Greedy accuracy on ``test_facts`` per language for each condition (see
    :func:`conditions`); ``lowest_language`` is chosen by :func:`lowest_above_zero` on the
    ``orig`` accuracies and ``relative_gain`` is each condition's relative change there (0
    everywhere when no language is above 0)."""
    conds = conditions(vectors, config, seed=seed)
    results = {
        c: score_facts(
            model,
            test_facts,
            intervention=conds[c],
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            progress=progress,
        )
        for c in names
    }
    accuracy = {c: r.accuracy() for c, r in results.items()}
    english = {c: r.english_rate() for c, r in results.items()}
    orig = accuracy.get("orig") or next(iter(accuracy.values()))
    lowest = lowest_above_zero(orig)
    gains = {
        c: (0.0 if lowest is None else relative_gain(a[lowest], orig[lowest]))
        for c, a in accuracy.items()
    }
    return ConditionResults(accuracy, english, lowest, gains, results, config, vectors.unit)


def stack_norm(v: Float[Tensor, "layer d_model"]) -> list[float]:
    """Per-layer L2 norms of a ``[n_layers, d_model]`` stack."""
    return v.norm(dim=-1).tolist()

"""The two repair vectors of Lu et al. (2025) and their sweep/evaluation.

* **Recall-engagement (task) vector**: the mean last-token ``resid_pre`` over few-shot recall
  prompts (optionally minus the zero-shot mean), for every layer. Added in middle layers at
  the last prompt token, it pushes the model into "recall the fact" mode.
* **Back-translation (difference) vector**: mean last-token ``resid_pre`` over explicit
  translation prompts ("English: Rome\\nFrench:") minus the mean over zero-shot recall
  prompts, for every layer. Added in late layers, it pushes the model into "say it in the
  target language" mode.

Both are ``[n_layers, d_model]`` stacks (:class:`~mechlingo.interventions.SteeringVector`
with no layer); applying one picks a layer and a scale with ``.at(layer, alpha)``.

Protocol (:func:`run_steering`): facts are split by id into build/dev/test
(:func:`split_facts`); vectors are built on the build split; layer and scale are chosen on
dev (:func:`sweep`); accuracy per language is reported on test for ``orig``, ``task``,
``diff``, ``both`` and ``random`` (norm-matched random vectors at the same places).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxtyping import Float
from torch import Tensor

from mechlingo.data import Fact, few_shot_prompt, translation_prompt
from mechlingo.evaluate import EvalResult, evaluate_facts
from mechlingo.interventions import (
    Compose,
    Intervention,
    SteeringVector,
    load_intervention,
    model_info,
    random_like,
)
from mechlingo.kernels.means import last_token_means

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = [
    "CONDITIONS",
    "RepairVectors",
    "SteeringConfig",
    "SweepResult",
    "build_repair_vectors",
    "score_facts",
    "conditions",
    "evaluate_conditions",
    "relative_gain",
    "split_facts",
    "sweep",
    "transfer",
]

CONDITIONS = ("orig", "task", "diff", "both", "random")
SPLITS = ("build", "dev", "test")


# --------------------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------------------


def _unit(key: str) -> float:
    h = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def split_of(fact_id: str, fractions: Sequence[float] = (0.3, 0.2, 0.5), salt: str = "") -> str:
    """``"build"``, ``"dev"`` or ``"test"`` for a fact id, from a hash of the id (the same
    fact goes to the same split in every language and every run)."""
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1: {fractions}")
    u = _unit(f"{salt}|{fact_id}")
    if u < fractions[0]:
        return "build"
    if u < fractions[0] + fractions[1]:
        return "dev"
    return "test"


def split_facts(
    facts: Iterable[Fact], fractions: Sequence[float] = (0.3, 0.2, 0.5), salt: str = ""
) -> dict[str, list[Fact]]:
    """Split facts into build/dev/test by a hash of the fact id (deterministic; a fact id is
    never in two splits, so no fact seen while building or choosing is scored on test)."""
    out: dict[str, list[Fact]] = {s: [] for s in SPLITS}
    for f in facts:
        out[split_of(f.id, fractions, salt)].append(f)
    return out


def take_per_lang(facts: Sequence[Fact], n: int | None) -> list[Fact]:
    """At most ``n`` fact ids per (relation, language), the same ids in every language."""
    if n is None:
        return list(facts)
    ids_by_rel: dict[str, list[str]] = {}
    for f in facts:
        ids = ids_by_rel.setdefault(f.relation, [])
        if f.id not in ids:
            ids.append(f.id)
    keep = {i for ids in ids_by_rel.values() for i in sorted(ids, key=_unit)[:n]}
    return [f for f in facts if f.id in keep]


# --------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------


def repair_prompts(
    facts: Sequence[Fact], *, pool: Sequence[Fact] | None = None, k_shot: int = 3, seed: int = 0
) -> dict[str, list[str]]:
    """The three prompt sets the vectors are built from.

    * ``few_shot``: ``k_shot`` solved demonstrations (same relation and language, from
      ``pool``) then the query;
    * ``zero_shot``: the fact's own prompt;
    * ``translation``: "English: <answer_en>\\n<Language>:" for non-English facts.
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
            trans.append(translation_prompt(f, src="en"))
    if not few:
        raise ValueError(
            f"no few-shot prompt could be built: the pool needs at least {k_shot + 1} facts per "
            "relation and language"
        )
    if not trans:
        raise ValueError("no translation prompts: the build facts need non-English languages")
    return {"few_shot": few, "zero_shot": zero, "translation": trans}


@dataclass
class RepairVectors:
    """The recall-engagement (task) and back-translation (diff) vector stacks.

    Attributes:
        task: ``SteeringVector`` holding ``[n_layers, d_model]``; place with ``.at(l, a)``.
        diff: same for the back-translation vector.
        means: the float32 ``[n_layers, d_model]`` mean last-token residuals it was built from
            (``few_shot``, ``zero_shot``, ``translation``).
        build: how it was built (prompt counts, languages, relations, options).
    """

    task: SteeringVector
    diff: SteeringVector
    means: dict[str, Tensor] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)

    def norms(self) -> dict[str, list[float]]:
        """Per-layer norms of each stack (the scale a given ``alpha`` multiplies)."""
        return {
            "task": self.task.vector.norm(dim=-1).tolist(),
            "diff": self.diff.vector.norm(dim=-1).tolist(),
        }

    def save(self, folder: str | Path, model: Any = None) -> Path:
        """``folder/task`` and ``folder/diff`` (each a saved intervention) + ``build.json``."""
        folder = Path(folder)
        self.task.save(folder / "task", model)
        self.diff.save(folder / "diff", model)
        (folder / "build.json").write_text(json.dumps(self.build, indent=2, ensure_ascii=False))
        return folder

    @classmethod
    def load(cls, folder: str | Path, model: Any = None) -> RepairVectors:
        """Load what :meth:`save` wrote; with ``model``, check that the vectors fit it."""
        folder = Path(folder)
        task = load_intervention(folder / "task", model)
        diff = load_intervention(folder / "diff", model)
        if not isinstance(task, SteeringVector) or not isinstance(diff, SteeringVector):
            raise ValueError(f"{folder} does not hold two steering vectors")
        build_path = folder / "build.json"
        build = json.loads(build_path.read_text()) if build_path.is_file() else {}
        return cls(task, diff, {}, build)


def build_repair_vectors(
    model: Any,
    facts: Sequence[Fact],
    *,
    pool: Sequence[Fact] | None = None,
    k_shot: int = 3,
    subtract_zero_shot: bool = False,
    batch_size: int = 16,
    progress: bool = False,
) -> RepairVectors:
    """Build both vector stacks from ``facts`` (one streaming pass per prompt set).

    Args:
        facts: the build facts (their languages and relations are what the vectors are
            "built from"; apply them to others to test transfer).
        pool: facts to draw few-shot demonstrations from (default ``facts``).
        k_shot: demonstrations per few-shot prompt.
        subtract_zero_shot: task vector = few-shot mean minus zero-shot mean (a difference,
            small norm) instead of the raw few-shot mean.

    Returns:
        :class:`RepairVectors`; ``task.vector`` and ``diff.vector`` are ``[n_layers, d_model]``.
    """
    facts = list(facts)
    t0 = time.time()
    prompts = repair_prompts(facts, pool=pool, k_shot=k_shot)
    means = {
        name: last_token_means(model, ps, batch_size=batch_size, progress=progress)
        for name, ps in prompts.items()
    }
    few, zero, trans = means["few_shot"], means["zero_shot"], means["translation"]
    task = (few - zero) if subtract_zero_shot else few.mean
    diff = trans - zero
    info = model_info(model)
    build = {
        "n_prompts": {k: len(v) for k, v in prompts.items()},
        "langs": sorted({f.lang for f in facts}),
        "relations": sorted({f.relation for f in facts}),
        "n_facts": len({f.id for f in facts}),
        "k_shot": k_shot,
        "subtract_zero_shot": subtract_zero_shot,
        "site": "resid_pre",
        "positions": "last",
        "seconds": round(time.time() - t0, 1),
    }
    task_meta = {"name": "task", "model": info, "build": build}
    diff_meta = {"name": "diff", "model": info, "build": build}
    return RepairVectors(
        SteeringVector(task.float().cpu(), None, 1.0, meta=task_meta),
        SteeringVector(diff.float().cpu(), None, 1.0, meta=diff_meta),
        {k: v.mean.float().cpu() for k, v in means.items()},
        build,
    )


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_layer": self.task_layer,
            "task_alpha": self.task_alpha,
            "diff_layer": self.diff_layer,
            "diff_alpha": self.diff_alpha,
        }


def conditions(
    vectors: RepairVectors, config: SteeringConfig, *, seed: int = 0, positions: Any = "last"
) -> dict[str, Intervention | None]:
    """The five conditions: ``orig`` (nothing), ``task``, ``diff``, ``both`` (task then diff)
    and ``random`` (random vectors with the norms of task and diff at the same layers and
    scales, applied together)."""
    task = vectors.task.at(config.task_layer, config.task_alpha, positions=positions)
    diff = vectors.diff.at(config.diff_layer, config.diff_alpha, positions=positions)
    rand = Compose(
        [
            SteeringVector(
                random_like(task.direction(), seed),
                config.task_layer,
                config.task_alpha,
                positions=positions,
                meta={"name": "random(task)"},
            ),
            SteeringVector(
                random_like(diff.direction(), seed + 1),
                config.diff_layer,
                config.diff_alpha,
                positions=positions,
                meta={"name": "random(diff)"},
            ),
        ]
    )
    return {"orig": None, "task": task, "diff": diff, "both": task + diff, "random": rand}


# --------------------------------------------------------------------------------------
# Batched (padded) greedy generation
# --------------------------------------------------------------------------------------


def score_facts(
    model: Any,
    facts: Sequence[Fact],
    *,
    intervention: Intervention | None = None,
    max_new_tokens: int = 6,
    batch_size: int = 32,
    progress: bool = False,
) -> EvalResult:
    """Greedy accuracy on ``facts`` by the eval rule (:func:`mechlingo.evaluate.evaluate_facts`)."""
    return evaluate_facts(
        model,
        list(facts),
        intervention=intervention,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        progress=progress,
    )


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


# --------------------------------------------------------------------------------------
# Sweep on dev
# --------------------------------------------------------------------------------------


@dataclass
class SweepResult:
    """Dev accuracy for each tried setting.

    ``rows``: one dict per setting with ``vector`` (``task``/``diff``/``both``), ``layer``,
    ``alpha`` (for ``both``: ``task_layer``, ``task_alpha``, ``diff_layer``, ``diff_alpha``),
    ``accuracy`` (mean over languages) and ``per_lang``. ``baseline``: dev accuracy per
    language without intervention. ``best``: the chosen :class:`SteeringConfig`.
    """

    rows: list[dict[str, Any]]
    baseline: dict[str, float]
    best: SteeringConfig
    score: str = "mean"

    def to_dataframe(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in r.items() if k != "per_lang"} for r in self.rows])

    def fig_heatmap(self, vector: str) -> go.Figure:
        """Dev accuracy over layer x alpha for one vector alone (``task`` or ``diff``)."""
        import plotly.graph_objects as go

        rows = [r for r in self.rows if r["vector"] == vector]
        layers = sorted({r["layer"] for r in rows})
        alphas = sorted({r["alpha"] for r in rows})
        grid = [[None] * len(layers) for _ in alphas]
        for r in rows:
            grid[alphas.index(r["alpha"])][layers.index(r["layer"])] = r["accuracy"]
        fig = go.Figure(
            go.Heatmap(
                z=grid,
                x=[str(x) for x in layers],
                y=[f"{a:g}" for a in alphas],
                colorscale="Viridis",
                zmin=0,
                zmax=1,
                text=[[("" if v is None else f"{v:.2f}") for v in row] for row in grid],
                texttemplate="%{text}",
                colorbar={"title": "dev acc"},
            )
        )
        base = _mean(self.baseline.values())
        fig.update_layout(
            title=f"{vector} vector alone: dev accuracy (no intervention: {base:.2f})",
            xaxis_title="layer",
            yaxis_title="alpha",
            height=360,
        )
        return fig


def _dev_score(acc: dict[str, float], how: str) -> float:
    return min(acc.values()) if how == "min" else _mean(acc.values())


def sweep(
    model: Any,
    vectors: RepairVectors,
    dev_facts: Sequence[Fact],
    *,
    task_layers: Sequence[int],
    task_alphas: Sequence[float],
    diff_layers: Sequence[int],
    diff_alphas: Sequence[float],
    top_k: int = 2,
    score: str = "mean",
    max_new_tokens: int = 6,
    batch_size: int = 32,
    progress: bool = False,
) -> SweepResult:
    """Grid over layer x alpha for each vector alone, then the ``top_k`` x ``top_k`` best
    pairs combined (separate layers only), all scored on ``dev_facts``.

    Args:
        score: ``"mean"`` (mean accuracy over languages) or ``"min"`` (the worst language).

    Returns:
        :class:`SweepResult` whose ``best`` is the best combined setting (or, if combining
        never beats the best single vectors, the combination of the two best singles).
    """
    dev_facts = list(dev_facts)

    def run(iv: Intervention | None) -> dict[str, float]:
        return score_facts(
            model,
            dev_facts,
            intervention=iv,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            progress=progress,
        ).accuracy()

    baseline = run(None)
    rows: list[dict[str, Any]] = []
    for name, stack, layers, alphas in (
        ("task", vectors.task, task_layers, task_alphas),
        ("diff", vectors.diff, diff_layers, diff_alphas),
    ):
        for layer in layers:
            for alpha in alphas:
                acc = run(stack.at(layer, alpha))
                rows.append(
                    {
                        "vector": name,
                        "layer": layer,
                        "alpha": alpha,
                        "accuracy": _dev_score(acc, score),
                        "per_lang": acc,
                    }
                )

    def best(name: str) -> list[dict[str, Any]]:
        cand = [r for r in rows if r["vector"] == name]
        return sorted(cand, key=lambda r: (-r["accuracy"], r["alpha"], r["layer"]))[:top_k]

    combos = []
    for t in best("task"):
        for d in best("diff"):
            if t["layer"] == d["layer"]:
                continue
            cfg = SteeringConfig(t["layer"], t["alpha"], d["layer"], d["alpha"])
            iv = conditions(vectors, cfg)["both"]
            acc = run(iv)
            row = {
                "vector": "both",
                **cfg.to_dict(),
                "accuracy": _dev_score(acc, score),
                "per_lang": acc,
            }
            rows.append(row)
            combos.append((row["accuracy"], cfg))
    if combos:
        chosen = max(combos, key=lambda x: x[0])[1]
    else:
        t, d = best("task")[0], best("diff")[0]
        chosen = SteeringConfig(t["layer"], t["alpha"], d["layer"], d["alpha"])
    return SweepResult(rows, baseline, chosen, score)


# --------------------------------------------------------------------------------------
# Evaluation on test
# --------------------------------------------------------------------------------------


def relative_gain(new: float, old: float) -> float:
    """``(new - old) / old``; ``inf`` when ``old`` is 0 and ``new`` is not, 0 when both are."""
    if old == 0:
        return 0.0 if new == 0 else float("inf")
    return (new - old) / old


@dataclass
class ConditionResults:
    """Test results per condition.

    ``accuracy[condition][lang]``, ``english_rate[condition][lang]`` (answered with the
    English answer instead of the target-language one), ``lowest_language`` (lowest ``orig``
    accuracy), ``relative_gain[condition]`` on that language, ``results`` (the raw
    :class:`~mechlingo.evaluate.EvalResult` per condition).
    """

    accuracy: dict[str, dict[str, float]]
    english_rate: dict[str, dict[str, float]]
    lowest_language: str
    relative_gain: dict[str, float]
    results: dict[str, EvalResult]
    config: SteeringConfig

    def summary(self) -> dict[str, Any]:
        """JSON-ready headline numbers. A relative gain over an ``orig`` accuracy of 0 is
        infinite and written as ``null`` (the absolute accuracies are in ``accuracy``)."""

        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "accuracy": self.accuracy,
            "answered_in_english": self.english_rate,
            "lowest_language": self.lowest_language,
            "relative_gain_lowest": finite(self.relative_gain.get("both", 0.0)),
            "relative_gain_lowest_by_condition": {
                c: finite(g) for c, g in self.relative_gain.items()
            },
            "mean_accuracy": {c: _mean(a.values()) for c, a in self.accuracy.items()},
            "config": self.config.to_dict(),
        }

    def fig_accuracy(self, title: str = "Test accuracy per language and condition") -> go.Figure:
        from mechlingo.plots import accuracy_bars

        return accuracy_bars(self.accuracy, title)


def evaluate_conditions(
    model: Any,
    vectors: RepairVectors,
    config: SteeringConfig,
    test_facts: Sequence[Fact],
    *,
    names: Sequence[str] = CONDITIONS,
    seed: int = 0,
    max_new_tokens: int = 6,
    batch_size: int = 32,
    progress: bool = False,
) -> ConditionResults:
    """Greedy accuracy on ``test_facts`` per language for each condition (see
    :func:`conditions`); ``lowest_language`` is the language with the lowest ``orig``
    accuracy (ties: the first in sorted order) and ``relative_gain`` is each condition's
    relative change there."""
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
    lowest = min(sorted(orig), key=lambda lg: orig[lg])
    gains = {c: relative_gain(a[lowest], orig[lowest]) for c, a in accuracy.items()}
    return ConditionResults(accuracy, english, lowest, gains, results, config)


# --------------------------------------------------------------------------------------
# Transfer
# --------------------------------------------------------------------------------------


def transfer(
    model: Any,
    build_facts: Sequence[Fact],
    test_facts: Sequence[Fact],
    config: SteeringConfig,
    *,
    build_relations: Sequence[str] | None = None,
    test_relations: Sequence[str] | None = None,
    holdout_lang: str | None = None,
    k_shot: int = 3,
    max_new_tokens: int = 6,
    batch_size: int = 32,
    progress: bool = False,
) -> dict[str, Any]:
    """Language/dataset independence: build on some facts, apply to others.

    Vectors are built from ``build_facts`` restricted to ``build_relations`` and without
    ``holdout_lang``, then applied (with ``config``) to ``test_facts`` restricted to
    ``test_relations`` (and to ``holdout_lang`` when given). Returns the test accuracy per
    language of ``orig`` and ``both`` with those transferred vectors, and the build/test
    selections, so e.g. "built on capital, tested on currency" or "built without Hindi,
    tested on Hindi" can be read off.
    """
    bf = [
        f
        for f in build_facts
        if (build_relations is None or f.relation in build_relations)
        and (holdout_lang is None or f.lang != holdout_lang)
    ]
    tf = [
        f
        for f in test_facts
        if (test_relations is None or f.relation in test_relations)
        and (holdout_lang is None or f.lang == holdout_lang)
    ]
    if not bf or not tf:
        raise ValueError("the transfer selection leaves no build facts or no test facts")
    vectors = build_repair_vectors(model, bf, k_shot=k_shot, batch_size=batch_size)
    res = evaluate_conditions(
        model,
        vectors,
        config,
        tf,
        names=("orig", "both"),
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        progress=progress,
    )
    return {
        "built_on": {
            "relations": sorted({f.relation for f in bf}),
            "langs": sorted({f.lang for f in bf}),
        },
        "tested_on": {
            "relations": sorted({f.relation for f in tf}),
            "langs": sorted({f.lang for f in tf}),
        },
        "accuracy": res.accuracy,
        "mean": {c: _mean(a.values()) for c, a in res.accuracy.items()},
    }


def stack_norm(v: Float[Tensor, "layer d_model"]) -> list[float]:
    """Per-layer L2 norms of a ``[n_layers, d_model]`` stack."""
    return v.norm(dim=-1).tolist()

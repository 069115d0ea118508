"""The settings of the steering pipeline, each default written once.

What travels together is one frozen dataclass: :class:`BuildSettings` (how the two vectors
are built), :class:`DevGrid` (what the dev search tries and how it decides),
:class:`ScoringOptions` (how every item is scored), :class:`SplitSettings` (how the facts are
split by id) and :class:`MatrixSettings` (the sizes and grid of the transfer matrix). The
builders, the dev search, ``run_steer_eval``, ``transfer_matrix``, the CLI (``mechlingo
steer``) and the card's budgets all take these objects, so a default is written here and
nowhere else.

Layer rules: :func:`~mechlingo.core.sites.every_second_layer` (the dense dev grid) and
:func:`~mechlingo.core.sites.layers_at` (layers at fractions of the depth) live in
:mod:`mechlingo.core.sites`; :func:`matrix_layers` is the latter at
:data:`MATRIX_LAYER_FRACTIONS` (the tracer's ``default_mid_layers`` are lens entries, not
places to steer)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from mechlingo.core.defaults import (
    BATCH_SIZE,
    SEED,
    STEER_BATCH_SIZE,
    STEER_MAX_NEW_TOKENS,
)
from mechlingo.core.errors import InputError
from mechlingo.core.sites import every_second_layer, layers_at
from mechlingo.data.facts import Fact
from mechlingo.data.splits import split_facts, take_per_lang, take_shared
from mechlingo.scoring.evaluate import DecodeOptions
from mechlingo.scoring.scorers import METRICS, Scorer

__all__ = [
    "ALPHA_GRID",
    "MATRIX_ALPHAS",
    "MATRIX_LAYER_FRACTIONS",
    "BuildSettings",
    "DevGrid",
    "MatrixSettings",
    "ScoringOptions",
    "SplitSettings",
    "matrix_layers",
]

#: alpha grid in residual-norm units: a log scale from 0.03 to 0.6
ALPHA_GRID = (0.03, 0.063, 0.13, 0.28, 0.6)
#: alphas the transfer matrix's dev choice tries: the upper half of :data:`ALPHA_GRID`
MATRIX_ALPHAS = (0.13, 0.28, 0.6)
#: fractions of the depth the transfer matrix's dev choice tries (6, 10, 14 of 18): the
#: middle layers where the paper injects the task vector and the late ones of the
#: back-translation vector, in three points
MATRIX_LAYER_FRACTIONS = (0.35, 0.55, 0.75)


def _at_least(value: int, low: int, name: str) -> None:
    """A one-line :class:`InputError` when ``value`` is below ``low``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InputError(f"{name} must be an integer of at least {low}, got {value!r}")


def matrix_layers(n_layers: int) -> list[int]:
    """The layers the transfer matrix's dev choice tries: :func:`layers_at` the
    :data:`MATRIX_LAYER_FRACTIONS` (6, 10, 14 of 18)."""
    return layers_at(MATRIX_LAYER_FRACTIONS, n_layers)


@dataclass(frozen=True)
class BuildSettings:
    """How the two steering vectors are built (``mechlingo steer build``).

    Attributes:
        k_shot: solved demonstrations before each few-shot prompt of the task vector (and the
            few-shot headroom of the evaluation).
        translation_shots: solved translation pairs (other build facts) before each
            translation prompt of the back-translation (diff) vector.
        subtract_zero_shot: task vector = few-shot mean minus zero-shot mean (the default;
            see :func:`~mechlingo.analyses.recall.steering.build_steering_vectors`) instead of
            the plain few-shot mean.
        unit: ``"resid"`` (alpha is a fraction of the mean residual norm at the layer) or
            ``"raw"`` (the raw mean difference).
        batch_size: prompts per forward pass while building.
    """

    k_shot: int = 3
    translation_shots: int = 2
    subtract_zero_shot: bool = True
    unit: str = "resid"
    batch_size: int = BATCH_SIZE

    def __post_init__(self) -> None:
        _at_least(self.k_shot, 1, "k_shot (--k-shot)")
        _at_least(self.translation_shots, 0, "translation_shots (--translation-shots)")
        _at_least(self.batch_size, 1, "batch_size (--batch-size)")
        if self.unit not in ("resid", "raw"):
            raise InputError(f"unit {self.unit!r}: pass 'resid' or 'raw' (--unit)")

    @classmethod
    def of(cls, build: Mapping[str, Any]) -> BuildSettings:
        """The settings recorded in a :class:`~mechlingo.analyses.recall.steering.SteeringPair`'s
        ``build`` record (this class's defaults for keys it lacks, e.g. older vectors)."""
        d = cls()
        return cls(
            k_shot=int(build.get("k_shot", d.k_shot)),
            translation_shots=int(build.get("translation_shots", d.translation_shots)),
            subtract_zero_shot=bool(build.get("subtract_zero_shot", d.subtract_zero_shot)),
            unit=str(build.get("unit", d.unit)),
            batch_size=int(build.get("batch_size", d.batch_size)),
        )


@dataclass(frozen=True)
class DevGrid:
    """What the dev search tries and how it decides
    (:func:`~mechlingo.analyses.recall.dev_grid.choose_on_dev`).

    Attributes:
        task_layers, diff_layers: the layers of each vector (``None``:
            :func:`~mechlingo.core.sites.every_second_layer`).
        task_alphas, diff_alphas: the scales of each vector (residual-norm units with
            ``unit="resid"``).
        top_k: settings of each vector re-scored on the whole dev split; their best
            ``top_k`` x ``top_k`` pairs are scored with both vectors.
        screen_ids: fact ids (x every language) of the screen subset that scores the whole
            grid (``None``: the whole dev split).
        en_tolerance: largest allowed drop of English dev accuracy against no intervention.
        p_threshold: a setting is chosen only if it beats no intervention on the dev
            non-English items with exact McNemar ``p`` below this (also the headroom test of
            the lowest-language rule).
    """

    task_layers: tuple[int, ...] | None = None
    diff_layers: tuple[int, ...] | None = None
    task_alphas: tuple[float, ...] = ALPHA_GRID
    diff_alphas: tuple[float, ...] = ALPHA_GRID
    top_k: int = 3
    screen_ids: int | None = 8
    en_tolerance: float = 0.05
    p_threshold: float = 0.1

    def layers(self, n_layers: int) -> tuple[list[int], list[int]]:
        """The task and diff layers for a model of ``n_layers`` (the defaults filled in)."""
        task = list(self.task_layers or every_second_layer(n_layers))
        return task, list(self.diff_layers or every_second_layer(n_layers))


@dataclass(frozen=True, kw_only=True)
class ScoringOptions(DecodeOptions):
    """How every item of every stage of the steering protocol is scored: the scoring rule
    and the decoding options of :class:`~mechlingo.scoring.evaluate.DecodeOptions` (its
    fields, checks and docs), with the protocol's own defaults for the length and the batch
    (:data:`~mechlingo.core.defaults.STEER_MAX_NEW_TOKENS` and
    :data:`~mechlingo.core.defaults.STEER_BATCH_SIZE`: short prompts, each scored in every
    condition; ``mechlingo steer eval`` passes its ``--max-new-tokens`` and ``--batch-size``,
    whose defaults are those of every command).

    Attributes:
        metric: the scoring rule: ``"generate"`` (greedy generation by the eval rule),
            ``"rank"``, ``"klar"`` or a :class:`~mechlingo.scoring.scorers.Scorer`.
    """

    max_new_tokens: int = STEER_MAX_NEW_TOKENS
    batch_size: int = STEER_BATCH_SIZE
    metric: str | Scorer = "generate"

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least(self.max_new_tokens, 1, "max_new_tokens (--max-new-tokens)")
        if isinstance(self.metric, str) and self.metric not in METRICS:
            raise InputError(
                f"metric {self.metric!r}: pass 'generate', 'rank', 'klar' or a Scorer (--metric)"
            )

    def decode(self) -> DecodeOptions:
        """The decoding options alone (the metric dropped)."""
        return DecodeOptions(**{f.name: getattr(self, f.name) for f in fields(DecodeOptions)})

    def kw(self) -> dict[str, Any]:
        """The keyword arguments of a scoring call
        (:func:`~mechlingo.scoring.evaluate.evaluate_facts`): ``decoding``, the metric
        excluded."""
        return {"decoding": self.decode()}


@dataclass(frozen=True)
class SplitSettings:
    """How the facts are split by id into build, dev and test
    (:func:`mechlingo.data.splits.split_facts`).

    Attributes:
        fractions: the build, dev and test fractions of the fact ids.
        salt: changes the hash split (re-splits use ``{salt}#repeat{r}``).
        dev_per_lang, test_per_lang: at most this many ids per relation on dev and test
            (``None``: all), the same ids in every language.
        shared: the two caps count ids per language, shared evenly by the relations (each
            keeps its even share of the cap,
            :func:`~mechlingo.data.splits.take_shared`), so that a file of many relations
            scores what one relation does (the claims card's budgets).
    """

    fractions: tuple[float, ...] = (0.4, 0.2, 0.4)
    salt: str = ""
    dev_per_lang: int | None = None
    test_per_lang: int | None = None
    shared: bool = False

    def parts(
        self, facts: Sequence[Fact], salt: str | None = None
    ) -> tuple[list[Fact], list[Fact], list[Fact]]:
        """``(build, dev, test)``: the hash split of ``facts`` by id (``salt``: this one
        instead of :attr:`salt`, a re-split), dev and test at most their caps."""
        split = split_facts(facts, self.fractions, self.salt if salt is None else salt)
        take = take_shared if self.shared else take_per_lang
        return (
            split["build"],
            take(split["dev"], self.dev_per_lang),
            take(split["test"], self.test_per_lang),
        )


@dataclass(frozen=True)
class MatrixSettings:
    """The sizes and grid of one transfer matrix
    (:func:`~mechlingo.analyses.recall.transfer.transfer_matrix`).

    Attributes:
        cells: ``"full"`` (every single-relation row on every column) or ``"diagonal"``
            (``only_R`` on R only).
        build_ids: build fact ids per relation (``None``: as many as the smallest has).
        screen_ids, dev_ids: fact ids of each row's dev screen and dev split, spread evenly
            over the row's relations.
        test_ids: test fact ids per column relation (x every non-English test language).
        layers, alphas: the dev grid of both vectors (``layers`` ``None``:
            :func:`matrix_layers`).
        top_k: settings of each vector re-scored on the dev split.
        en_tolerance, p_threshold: as in :class:`DevGrid`.
        seed: seed of the random control and of the bootstrap.
        controls: random draws per cell (norm-matched random directions at the row's chosen
            place; 1: one control, as before; more: a population, judged by rank).
        held_out: the columns (``None``: every relation, or every non-English language).
    """

    cells: str = "full"
    build_ids: int | None = 16
    screen_ids: int = 4
    dev_ids: int = 12
    test_ids: int = 8
    layers: tuple[int, ...] | None = None
    alphas: tuple[float, ...] = MATRIX_ALPHAS
    top_k: int = 1
    en_tolerance: float = 0.05
    p_threshold: float = 0.1
    seed: int = SEED
    held_out: tuple[str, ...] | None = None
    controls: int = 1

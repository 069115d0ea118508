"""``mechlingo align`` as one call: cross-lingual alignment before and after a clamp (and its
control), with what ``summary.json`` and ``retrieval.csv`` hold.

:func:`run_alignment` embeds the parallel sentences without and with the clamp (and the
random-neuron control of the same k when there is one), per layer, as one resumable checkpoint
(``compare``), and, when asked, measures the clamp's side effects; it returns an
:class:`AlignRun`, whose :meth:`~AlignRun.summary` is the headline record (retrieval and
distances per arm at one layer, with bootstrap intervals over sentences and paired gains)
and whose :meth:`~AlignRun.write` puts the files into a folder in one step.
:func:`load_clamp_pair` reads a saved clamp and its control. The card's alignment stage calls
the same :func:`~mechlingo.analyses.experts.align.compare_alignment`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from mechlingo.analyses.experts.align import (
    AlignmentComparison,
    AlignmentError,
    Embeddings,
    compare_alignment,
)
from mechlingo.analyses.results import WritesFolder
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS
from mechlingo.core.errors import ArtifactError
from mechlingo.core.inert import inert_csv
from mechlingo.core.types import Model
from mechlingo.core.untrusted import load_tensors
from mechlingo.data import LANGS, load_facts
from mechlingo.interventions import Intervention, load_intervention
from mechlingo.scoring.side_effects import SideEffectOptions, SideEffects, side_effects

__all__ = ["AlignOptions", "AlignRun", "align_side_effects", "load_clamp_pair", "run_alignment"]

_ARMS = ("pre", "post", "control")


@dataclass
class AlignRun(WritesFolder):
    """Alignment before and after a clamp, read at one layer.

    Attributes:
        comparison: the embeddings and retrieval of every arm at every layer
            (:class:`~mechlingo.analyses.experts.align.AlignmentComparison`).
        layer: the layer of the headline numbers (``None``: the last embedded).
        side_effects: the clamp's side effects against its control, when measured.
    """

    comparison: AlignmentComparison
    layer: int | None = None
    side_effects: SideEffects | None = None

    @cached_property
    def record(self) -> dict[str, Any]:
        """The comparison's summary at :attr:`layer`
        (:meth:`~mechlingo.analyses.experts.align.AlignmentComparison.summary`: retrieval
        top-1 per ordered pair and distances, each keyed by arm ``pre``/``post``/``control``),
        its bootstrap ``intervals`` and the ``target`` language; computed once."""
        comp = self.comparison
        out = comp.summary(self.layer)
        out["intervals"] = comp.intervals(self.layer)
        out["target"] = comp.target
        return out

    def summary(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """:attr:`record`, then ``side_effects`` (when measured) and ``meta`` as given."""
        out = dict(self.record)
        if self.side_effects is not None:
            out["side_effects"] = self.side_effects.to_json()
        if meta is not None:
            out["meta"] = meta
        return out

    def files(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``summary.json`` and ``retrieval.csv`` (top-1 of every arm per layer and ordered
        pair of languages)."""
        return {
            "summary.json": self.summary(meta),
            "retrieval.csv": inert_csv(self.comparison.to_dataframe()),
        }


def load_clamp_pair(
    clamp: str | Path | None, control: str | Path | None, model: Model
) -> tuple[Intervention | None, Intervention | None]:
    """The clamp saved at ``clamp`` and its control: ``control``, or ``CLAMP-random`` when
    that folder exists, else ``None``; ``(None, None)`` without a clamp.

    Raises:
        FileNotFoundError, InterventionError: a folder that is missing or does not fit the
            model.
    """
    if not clamp:
        return None, None
    iv = load_intervention(clamp, model)
    ctl = control or (str(Path(clamp)) + "-random")
    if control or Path(ctl).is_dir():
        return iv, load_intervention(ctl, model)
    return iv, None


@dataclass(frozen=True)
class AlignOptions:
    """How :func:`run_alignment` measures (its defaults are these), checked when made.

    Attributes:
        target: the clamp's target language (``None``: none).
        centre: centre each language's embeddings before comparing.
        layer: the layer of the summary (``None``: the last).
        batch_size: sentences per forward pass.
        max_tokens: keep only the first N tokens of each sentence (``None``: all).
        side_effect_lines: measure the clamp's side effects on this many lines per
            language (``None``: not measured).
        progress: show progress bars.
    """

    target: str | None = None
    centre: bool = False
    layer: int | None = None
    batch_size: int = BATCH_SIZE
    max_tokens: int | None = None
    side_effect_lines: int | None = None
    progress: bool = PROGRESS

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise AlignmentError(
                f"batch_size must be an integer of at least 1, got {self.batch_size!r}"
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise AlignmentError(
                f"max_tokens must be at least 1 (or None: all), got {self.max_tokens}"
            )


def run_alignment(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    clamp: Intervention | None = None,
    control: Intervention | None = None,
    options: AlignOptions | None = None,
    *,
    checkpoints: Checkpoints | None = None,
) -> AlignRun:
    """Alignment of ``texts`` (``{lang: parallel sentences}``) before and after ``clamp``
    (and ``control``) at every layer, as ``mechlingo align`` measures it.

    The comparison (:func:`~mechlingo.analyses.experts.align.compare_alignment`) is the checkpoint
    ``compare`` of ``checkpoints`` when given (its embeddings and retrieval kept in a safetensors
    file). With ``side_effect_lines`` and a clamp, the clamp's side effects are measured too
    (:func:`align_side_effects`). ``layer`` is the layer of the summary (``None``: the last).
    The settings named here are ``options``' (:class:`AlignOptions`, its defaults when
    ``None``).

    Raises:
        AlignmentError: fewer than two languages, an unknown target or layer.
    """
    o = AlignOptions() if options is None else options
    try:
        comp = _staged_comparison(checkpoints, lambda: compare_alignment(
            model, texts, clamp, control=control, layers="all", target=o.target,
            centre=o.centre, batch_size=o.batch_size, max_tokens=o.max_tokens,
            progress=o.progress))  # fmt: skip
        run = AlignRun(comp, o.layer)
        _ = run.record  # a bad layer is refused here, before anything else is measured
    except AlignmentError:
        raise
    except ValueError as err:
        raise AlignmentError(str(err)) from err
    if o.side_effect_lines is not None and clamp is not None:
        run.side_effects = align_side_effects(
            model, clamp, control, texts, o.side_effect_lines, batch_size=o.batch_size,
            progress=o.progress,
        )  # fmt: skip
    return run


def align_side_effects(
    model: Model,
    clamp: Intervention,
    control: Intervention | None,
    texts: Mapping[str, Sequence[str]],
    n: int,
    *,
    batch_size: int = BATCH_SIZE,
    progress: bool = PROGRESS,
) -> SideEffects:
    """The clamp's side effects (:func:`mechlingo.scoring.side_effects.side_effects`) in every
    bundled language of ``texts`` against ``control`` (a norm-matched random one without):
    accuracy on ``n`` bundled capitals (natural templates), perplexity and output language on
    the last ``n`` lines of each language."""
    langs = [lg for lg in texts if lg in LANGS]
    facts = load_facts(langs=langs, relations=["capital"], limit=n, templates="natural")
    lines = {lg: list(texts[lg][-n:]) for lg in langs}
    opts = SideEffectOptions(batch_size=batch_size, progress=progress)
    return side_effects(model, clamp, facts, lines, control=control or "random", options=opts)


def _staged_comparison(
    checkpoints: Checkpoints | None, compare: Callable[[], AlignmentComparison]
) -> AlignmentComparison:
    """``compare()``, kept as checkpoint ``compare`` of ``checkpoints`` (its embeddings and retrieval
    matrices in a safetensors file) and read back from there; without checkpoints as it is."""
    if checkpoints is None:
        return compare()

    def fn(tmp: Path) -> dict[str, Any]:
        comp = compare()
        t: dict[str, Any] = {}
        for arm in _ARMS:
            emb, ret = comp._arm(arm)
            if emb is not None:
                t[f"{arm}.emb"], t[f"{arm}.retrieval"] = emb.emb, ret
        save_file({k: v.detach().cpu().contiguous() for k, v in t.items()},
                  str(tmp / "comparison.safetensors"))  # fmt: skip
        return {"langs": comp.langs, "layers": comp.layers, "target": comp.target,
                "centre": comp.centre, "meta": comp.meta}  # fmt: skip

    d = checkpoints.run("compare", fn, folder=True)
    t = load_tensors(checkpoints.path("compare") / "comparison.safetensors", ArtifactError,
                     finite=False, fix="delete the work folder (or rerun with --fresh)")  # fmt: skip

    def arm(name: str) -> tuple[Embeddings | None, Any]:
        if f"{name}.emb" not in t:
            return None, None
        return Embeddings(t[f"{name}.emb"], list(d["langs"]), list(d["layers"])), t[
            f"{name}.retrieval"]  # fmt: skip

    (pre, r_pre), (post, r_post), (ctl, r_ctl) = (arm(a) for a in _ARMS)
    assert pre is not None
    return AlignmentComparison(pre, post, r_pre, r_post, d["target"], bool(d["centre"]),
                               dict(d["meta"]), ctl, r_ctl)  # fmt: skip

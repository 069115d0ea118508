"""``mechlingo lens --decoder A,B,...`` as one call: several decoders read every layer of the
same facts, and the result says what ``summary.json``, ``lens.csv`` and ``patchscope.json``
hold.

:func:`run_lens_decoders` runs :func:`~mechlingo.analyses.decoders.compare.compare_decoders`
and returns a :class:`LensDecodersRun`: its :meth:`~LensDecodersRun.summary` is the lens
summary of every decoder (and, when English is tracked, where the English answer leads), its
:meth:`~LensDecodersRun.write` puts the files into a folder in one step. The command line
only parses its flags into the decoders (a loaded tuned lens, a
:class:`~mechlingo.analyses.decoders.patchscope.Patchscope`) and adds the report.

``mechlingo tuned-lens`` likewise: :func:`run_tuned_lens` trains the lens and measures its
held-out KL (each a resumable checkpoint) and returns a :class:`TunedLensRun`, whose
:meth:`~TunedLensRun.summary`, :meth:`~TunedLensRun.headline` and :meth:`~TunedLensRun.write`
say what the training gave and put the lens folder together.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mechlingo.analyses.decoders.compare import DecoderComparison, compare_decoders
from mechlingo.analyses.decoders.logit import LogitLens
from mechlingo.analyses.decoders.options import TrainingOptions
from mechlingo.analyses.decoders.registry import generates
from mechlingo.analyses.decoders.tuned_lens import (
    HELDOUT_BATCH_SIZE,
    TunedLens,
    TunedLensTraining,
    lens_divergence,
    load_tuned_lens,
    train_tuned_lens,
)
from mechlingo.analyses.results import WritesFolder
from mechlingo.core.artifacts import write_files
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS
from mechlingo.core.distributed import is_main
from mechlingo.core.inert import inert_csv
from mechlingo.core.types import Model
from mechlingo.viz.lens import lens_kl_figure

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["LensDecodersRun", "TunedLensRun", "run_lens_decoders", "run_tuned_lens"]


@dataclass
class LensDecodersRun(WritesFolder):
    """Several decoders on the same facts.

    Attributes:
        comparison: the lens result of every decoder (same entries, prompts and tracks).
        track: the languages tracked besides each prompt's own.
        max_rank: the rank counted as "decodable" in the summaries.
        continuations: whether a decoder generated continuations (they go to
            ``LABEL.json``, e.g. ``patchscope.json``).
    """

    comparison: DecoderComparison
    track: list[str]
    max_rank: int = 10
    continuations: bool = False

    @property
    def decoders(self) -> list[str]:
        """The decoder labels, in the order they were given."""
        return list(self.comparison.results)

    def summary(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``{"decoders": {label: lens summary}, "english_lead": rows, "meta": meta}``:
        the lens summary of each decoder (:meth:`~mechlingo.analyses.decoders.lens.LensResult.summary`
        at ``max_rank``), the English-lead table when English is tracked, and ``meta`` as
        given."""
        out: dict[str, Any] = {
            "decoders": {
                label: res.summary(max_rank=self.max_rank)
                for label, res in self.comparison.results.items()
            }
        }
        if "en" in self.track:
            out["english_lead"] = self.comparison.pivot_table()
        if meta is not None:
            out["meta"] = meta
        return out

    def to_dataframe(self) -> Any:
        """Every decoder's lens rows one under the other, with a ``decoder`` column."""
        import pandas as pd

        frames = [
            res.to_dataframe().assign(decoder=label)
            for label, res in self.comparison.results.items()
        ]
        return pd.concat(frames, ignore_index=True)

    def files(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``summary.json``, ``lens.csv`` and, for each decoder that generated (the
        patchscope with ``max_new_tokens``), ``LABEL.json`` (its continuations per prompt and
        layer)."""
        files: dict[str, Any] = {
            "summary.json": self.summary(meta),
            "lens.csv": inert_csv(self.to_dataframe()),
        }
        if self.continuations:
            for label, res in self.comparison.results.items():
                if res.meta.get("continuations") is not None:
                    files[f"{label}.json"] = res.meta["continuations"]
        return files


def run_lens_decoders(
    model: Model,
    facts: Sequence[Any],
    decoders: Mapping[str, Any],
    *,
    track_langs: Sequence[str] = (),
    max_rank: int = 10,
    batch_size: int = BATCH_SIZE,
    progress: bool = PROGRESS,
) -> LensDecodersRun:
    """Read every layer of ``facts`` with each of ``decoders`` (label -> a registered name or
    a decoder object, such as a built
    :class:`~mechlingo.analyses.decoders.registry.DecoderUse`), tracking ``track_langs``'
    answers too; ``max_rank`` is the rank its summary counts as decodable."""
    cmp = compare_decoders(
        model,
        facts,
        dict(decoders),
        track_langs=list(track_langs),
        batch_size=batch_size,
        progress=progress,
    )
    writes = any(not isinstance(d, str) and generates(d) for d in decoders.values())
    return LensDecodersRun(cmp, list(track_langs), max_rank, writes)


# --------------------------------------------------------------------------------------
# mechlingo tuned-lens
# --------------------------------------------------------------------------------------


@dataclass
class TunedLensRun:
    """A tuned lens trained on some text, with its held-out KL against the logit lens.

    Attributes:
        training: the trained lens and its loss curve
            (:class:`~mechlingo.analyses.decoders.tuned_lens.TunedLensTraining`).
        langs: the languages of the training text (``["text"]`` for a text file).
        text: where the text came from (a folder, a file, ``"bundled facts"``).
        heldout_kl: :func:`~mechlingo.analyses.decoders.tuned_lens.lens_divergence` of the
            logit and the tuned lens on the held-out texts (``None`` without them).
    """

    training: TunedLensTraining
    langs: list[str]
    text: str
    heldout_kl: dict[str, Any] | None = None

    @property
    def lens(self) -> TunedLens:
        """The trained lens."""
        return self.training.lens

    def summary(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``training`` (steps, tokens, time, the first and last steps' mean loss per entry,
        the settings), ``langs``, ``text``, ``heldout_kl`` (with held-out texts) and ``meta``
        as given."""
        out: dict[str, Any] = {
            "training": self.training.summary(),
            "langs": self.langs,
            "text": self.text,
        }
        if self.heldout_kl is not None:
            out["heldout_kl"] = self.heldout_kl
        if meta is not None:
            out["meta"] = meta
        return out

    def headline(self) -> list[tuple[str, str]]:
        """``(label, value)`` rows: steps and tokens, the mean loss over the entries at the
        start and at the end, and the held-out KL of each decoder (mean over the entries)."""
        t = self.training.summary()
        rows = [
            ("Training", f"{t['steps']} steps, {t['tokens']} tokens, {len(self.langs)} language(s)"),
            ("Mean KL per entry, first -> last steps",
             f"{_mean(t['loss_first_steps']):.3f} -> {_mean(t['loss_last_steps']):.3f}"),
        ]  # fmt: skip
        kl = (self.heldout_kl or {}).get("decoders", {})
        if kl:
            rows.append(("Held-out KL(final || lens), mean over entries",
                         ", ".join(f"{d} {_mean(v['kl']):.3f}" for d, v in kl.items())))  # fmt: skip
        return rows

    def figures(self) -> list[tuple[str, go.Figure]]:
        """``(heading, figure)``: the loss curve and, with held-out texts, the held-out KL
        per layer."""
        figs = [("Loss curve", self.training.fig_loss())]
        if self.heldout_kl is not None:
            figs.append(("Held-out KL(final || lens) per layer", lens_kl_figure(self.heldout_kl)))
        return figs

    def loss_csv(self) -> str:
        """``step,entry,kl,tokens`` rows of the loss curve."""
        tr = self.training
        rows = ["step,entry,kl,tokens"]
        for s, row in enumerate(tr.loss.tolist()):
            rows += [f"{s},{e},{v:.6g},{tr.tokens[s]}" for e, v in enumerate(row)]
        return "\n".join(rows) + "\n"

    def files(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """The lens (``translators.safetensors``, ``tuned_lens.json``), ``summary.json`` and
        ``loss.csv``."""
        return self.lens.files() | {"summary.json": self.summary(meta), "loss.csv": self.loss_csv()}

    def write(
        self, out: str | Path, *, meta: dict[str, Any] | None = None, extra: dict | None = None
    ) -> Path:
        """Write :meth:`files` (and ``extra`` ones, e.g. the report) into ``out`` in one
        step, dropping whatever else was there; under torchrun on rank 0 only. Returns the
        folder."""
        if not is_main():
            return Path(out)
        return write_files(out, {**self.files(meta), **(extra or {})}, keep_others=False)


def _mean(xs: Sequence[float | None]) -> float:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def run_tuned_lens(
    model: Model,
    train: Sequence[str],
    heldout: Sequence[str] = (),
    *,
    langs: Sequence[str],
    text: str,
    lines: str | None = None,
    training: TrainingOptions | Mapping[str, Any] | None = None,
    batch_size: int = HELDOUT_BATCH_SIZE,
    checkpoints: Checkpoints | None = None,
) -> TunedLensRun:
    """Train a tuned lens on ``train`` and, with ``heldout`` texts, measure its held-out KL
    against the logit lens, as ``mechlingo tuned-lens`` does.

    ``training``: how the lens is trained
    (:class:`~mechlingo.analyses.decoders.options.TrainingOptions`, or a mapping of its
    fields);
    ``batch_size`` is the texts per forward pass of the held-out KL. ``langs``, ``text``
    (where the text came from) and ``lines`` (``START:STOP`` of the training lines, ``None``
    for all) are recorded in the lens's ``meta``. The training (the lens saved, read back
    through :func:`~mechlingo.analyses.decoders.tuned_lens.load_tuned_lens` and its checks)
    and the held-out KL are the checkpoints ``train`` and ``heldout`` of ``checkpoints``; without
    ``checkpoints`` they go through a temporary folder, so the numbers are the command's.
    """
    with contextlib.ExitStack() as stack:
        if checkpoints is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="mechlingo-lens-"))
            checkpoints = Checkpoints(tmp, {"temporary": True})
        tr = _staged_training(checkpoints, model, train, TrainingOptions.of(training))
        tr.lens.meta |= {"text": text, "langs": list(langs), "lines": lines}
        div = None
        if heldout:
            div = checkpoints.run("heldout", lambda: lens_divergence(
                model, list(heldout), {LogitLens.name: None, tr.lens.name: tr.lens},
                batch_size=batch_size))  # fmt: skip
    return TunedLensRun(tr, list(langs), text, div)


def _staged_training(
    checkpoints: Checkpoints, model: Model, train: Sequence[str], options: TrainingOptions
) -> TunedLensTraining:
    """The training as checkpoint ``train`` (the lens saved in the checkpoint folder, the loss curve
    in its result), read back through :func:`load_tuned_lens` and its checks."""

    def fn(tmp: Path) -> dict[str, Any]:
        tr = train_tuned_lens(model, train, options)
        tr.lens.save(tmp / "lens")
        return {"loss": tr.loss.tolist(), "tokens": tr.tokens, "seconds": tr.seconds,
                "world_size": tr.world_size, "config": tr.config}  # fmt: skip

    d = checkpoints.run("train", fn, folder=True)
    lens = load_tuned_lens(checkpoints.path("train") / "lens", model)
    loss = torch.tensor(
        [[math.nan if v is None else v for v in row] for row in d["loss"]], dtype=torch.float32
    )
    return TunedLensTraining(lens, loss, list(d["tokens"]), float(d["seconds"]),
                             int(d["world_size"]), dict(d["config"]))  # fmt: skip

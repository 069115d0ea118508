"""``mechlingo lens --decoder A,B,...`` as one call: several decoders read every layer of the
same facts, and the result says what ``summary.json``, ``lens.csv`` and ``patchscope.json``
hold.

:func:`run_lens_decoders` runs :func:`~mechlingo.analyses.decoders.compare.compare_decoders`
and returns a :class:`LensDecodersRun`: its :meth:`~LensDecodersRun.summary` is the lens
summary of every decoder (and, when English is tracked, where the English answer leads), its
:meth:`~LensDecodersRun.write` puts the files into a folder in one step. The command line
only parses its flags into the decoders (a loaded tuned lens, a
:class:`~mechlingo.analyses.decoders.patchscope.Patchscope`) and adds the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mechlingo.analyses.decoders.compare import DecoderComparison, compare_decoders
from mechlingo.analyses.decoders.patchscope import Patchscope
from mechlingo.analyses.results import WritesFolder
from mechlingo.core.types import Model

__all__ = ["LensDecodersRun", "run_lens_decoders"]


@dataclass
class LensDecodersRun(WritesFolder):
    """Several decoders on the same facts.

    Attributes:
        comparison: the lens result of every decoder (same entries, prompts and tracks).
        track: the languages tracked besides each prompt's own.
        max_rank: the rank counted as "decodable" in the summaries.
        continuations: whether the patchscope generated continuations (they go to
            ``patchscope.json``).
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
        """``summary.json``, ``lens.csv`` and, when the patchscope generated,
        ``patchscope.json`` (its continuations per prompt and layer)."""
        files: dict[str, Any] = {
            "summary.json": self.summary(meta),
            "lens.csv": self.to_dataframe().to_csv(index=False),
        }
        if self.continuations and "patchscope" in self.comparison.results:
            files["patchscope.json"] = self.comparison.results["patchscope"].meta.get(
                "continuations"
            )
        return files


def run_lens_decoders(
    model: Model,
    facts: Sequence[Any],
    decoders: Mapping[str, Any],
    *,
    track_langs: Sequence[str] = (),
    max_rank: int = 10,
    batch_size: int = 16,
    progress: bool = True,
) -> LensDecodersRun:
    """Read every layer of ``facts`` with each of ``decoders`` (label -> ``"logit"``, a
    :class:`~mechlingo.analyses.decoders.tuned_lens.TunedLens` or a
    :class:`~mechlingo.analyses.decoders.patchscope.Patchscope`), tracking ``track_langs``'
    answers too; ``max_rank`` is the rank its summary counts as decodable."""
    cmp = compare_decoders(
        model,
        facts,
        dict(decoders),
        track_langs=list(track_langs),
        batch_size=batch_size,
        progress=progress,
    )
    generates = any(isinstance(d, Patchscope) and d.max_new_tokens for d in decoders.values())
    return LensDecodersRun(cmp, list(track_langs), max_rank, generates)

"""``mechlingo experts`` as one result: the expert neurons, their clamps and controls, the k
curve of every target and the k its rule chose, with what ``summary.json``, ``experts.csv``,
``kcurve.csv`` and the clamp folders hold.

:class:`ExpertsRun` is built from the pieces the command computes (the scored neurons, the
saved clamps, the k curves; the command keeps each as a resumable stage) and says what they
mean: :meth:`~ExpertsRun.choices` applies the k rule
(:meth:`~mechlingo.analyses.experts.kcurve.KCurve.choose`), :meth:`~ExpertsRun.summary` is
the headline record, :meth:`~ExpertsRun.write` puts every file into a folder in one step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlingo.activations.distributed import is_main
from mechlingo.analyses.experts.kcurve import PPL_BUDGET, KCurve, OthersRule
from mechlingo.analyses.experts.selection import ExpertResult
from mechlingo.core.artifacts import write_files

__all__ = ["ExpertsRun"]


@dataclass
class ExpertsRun:
    """The expert neurons of ``targets`` at every k, with the k curve and the k rule.

    Attributes:
        experts: the scored neurons (:class:`~mechlingo.analyses.experts.selection.ExpertResult`).
        targets: the target languages.
        ks: the expert counts, sorted and distinct.
        clamps: ``{name: folder}`` of the saved clamps (``es-k100``) and their random-neuron
            controls (``es-k100-random``).
        curves: ``{target: KCurve}`` (empty when the k curve was skipped).
        ppl_budget: the k rule's bound on the target's held-out perplexity ratio.
        ppl_others: how the other languages' perplexity ratios enter the rule.
    """

    experts: ExpertResult
    targets: list[str]
    ks: list[int]
    clamps: Mapping[str, Path] = field(default_factory=dict)
    curves: Mapping[str, KCurve] = field(default_factory=dict)
    ppl_budget: float = PPL_BUDGET
    ppl_others: OthersRule = "none"

    @property
    def k_show(self) -> int:
        """The k of the summary's neuron tables: the smallest k, at most every neuron."""
        return min(self.ks[0], self.experts.stats.n_features)

    def choices(self) -> dict[str, dict[str, Any]]:
        """``{target: choice}`` of the k rule on each target's k curve (``choice["k"]`` is
        ``None`` when no k keeps the perplexity within the budget)."""
        return {t: c.choose(self.ppl_budget, self.ppl_others) for t, c in self.curves.items()}

    def summary(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """The experts' summary at :attr:`k_show`, then ``targets``, ``clamps``, the k curves
        (``k_curve``), the rule's choice (``k_choice``, ``chosen_k``; with the papers' rule
        also the stricter geomean rule's as ``k_choice_stricter``), the paired tests of each
        k (``k_tests``) and ``meta`` as given."""
        choices = self.choices()
        out = self.experts.summary(self.k_show)
        out["targets"] = self.targets
        out["clamps"] = sorted(self.clamps)
        out["k_curve"] = {t: c.records() for t, c in self.curves.items()}
        out["k_choice"] = choices
        if self.ppl_others == "none":  # the stricter rule beside the papers'
            out["k_choice_stricter"] = {
                t: c.choose(self.ppl_budget, "geomean") for t, c in self.curves.items()
            }
        out["chosen_k"] = {t: ch["k"] for t, ch in choices.items()}
        out["k_tests"] = {t: c.tests() for t, c in self.curves.items()}
        if meta is not None:
            out["meta"] = meta
        return out

    def kcurve_csv(self) -> str:
        """The k curves of every target as one CSV (a ``lang`` column names the target)."""
        import pandas as pd

        frames = [c.to_dataframe().assign(lang=t) for t, c in self.curves.items()]
        return pd.concat(frames).to_csv(index=False)

    def files(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``summary.json``, ``experts.csv`` (the top neurons up to the largest k),
        ``kcurve.csv`` (with a k curve) and every file of every clamp folder
        (``es-k100/...``)."""
        files: dict[str, Any] = {
            "summary.json": self.summary(meta),
            "experts.csv": self.experts.to_dataframe(max(self.ks)).to_csv(index=False),
        }
        if self.curves:
            files["kcurve.csv"] = self.kcurve_csv()
        for name, folder in self.clamps.items():
            files.update(
                {
                    f"{name}/{p.name}": p.read_bytes()
                    for p in sorted(Path(folder).iterdir())
                    if p.is_file()
                }  # fmt: skip
            )
        return files

    def write(
        self, out: str | Path, *, meta: dict[str, Any] | None = None, extra: dict | None = None
    ) -> Path:
        """Write :meth:`files` (and ``extra`` ones, e.g. the report) into ``out`` in one
        step, dropping whatever else was there (no stale clamp of an earlier k survives);
        under torchrun on rank 0 only. Returns the folder."""
        if not is_main():
            return Path(out)
        return write_files(out, {**self.files(meta), **(extra or {})}, keep_others=False)

"""``mechlingo eval`` as one call: accuracy per language with Wilson intervals, and what
``summary.json`` and ``generations.jsonl`` hold.

:func:`run_eval` scores the facts (:func:`mechlingo.scoring.evaluate.evaluate_facts`) and
returns an :class:`EvalRun`: :meth:`~EvalRun.summary` is the headline record (accuracy per
language with its Wilson 95% interval, :func:`accuracy_intervals`; the rate of English
answers to non-English prompts; what the metric skipped, and the metric's own summary),
:meth:`~EvalRun.write` puts the files into a folder in one step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechlingo.core.artifacts import write_files
from mechlingo.core.defaults import BATCH_SIZE, MAX_NEW_TOKENS, PROGRESS
from mechlingo.core.distributed import is_main
from mechlingo.core.types import Model
from mechlingo.data import Fact
from mechlingo.kernels.significance import wilson_table
from mechlingo.scoring.evaluate import DecodeOptions, EvalResult, evaluate_facts
from mechlingo.scoring.scorers import Scorer

__all__ = ["EvalRun", "accuracy_intervals", "run_eval"]


def accuracy_intervals(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Wilson 95% interval of the accuracy of each language of ``records`` (each with
    ``lang`` and ``correct``), languages sorted, as JSON (``estimate``, ``lo``, ``hi``,
    ``n``, ``confidence``, ``k``)."""
    by_lang: dict[str, list[bool]] = {}
    for r in records:
        by_lang.setdefault(r["lang"], []).append(bool(r["correct"]))
    table = wilson_table({"accuracy": dict(sorted(by_lang.items()))})["accuracy"]
    return {lg: iv.to_json() for lg, iv in table.items()}


@dataclass
class EvalRun:
    """Facts scored under one metric.

    Attributes:
        result: the scored records (:class:`~mechlingo.scoring.evaluate.EvalResult`).
        scorer: the metric they were scored with.
    """

    result: EvalResult
    scorer: Scorer

    def summary(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``metric``, ``accuracy`` per language, ``accuracy_ci`` (:func:`accuracy_intervals`),
        ``answered_in_english`` (the share of non-English prompts answered in English),
        ``skipped`` (facts the metric could not score, by reason), the metric's own summary
        (e.g. RankC under ``rank``, CLC under ``klar``) and ``meta`` as given."""
        res = self.result
        out: dict[str, Any] = {
            "metric": self.scorer.to_json(),
            "accuracy": res.accuracy(),
            "accuracy_ci": accuracy_intervals(res.records),
            "answered_in_english": res.english_rate(),
            "skipped": res.skipped,
            **res.metric_summary(),
        }
        if meta is not None:
            out["meta"] = meta
        return out

    def generations(self) -> str:
        """``generations.jsonl``: one JSON record per scored fact."""
        return "\n".join(json.dumps(r, ensure_ascii=False) for r in self.result.records) + "\n"

    def files(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``summary.json`` and ``generations.jsonl``."""
        return {"summary.json": self.summary(meta), "generations.jsonl": self.generations()}

    def write(
        self, out: str | Path, *, meta: dict[str, Any] | None = None, extra: dict | None = None
    ) -> Path:
        """Write :meth:`files` (and ``extra`` ones, e.g. the report) into ``out`` in one
        step; under torchrun on rank 0 only. Returns the folder."""
        files = {**self.files(meta), **(extra or {})}
        return write_files(out, files) if is_main() else Path(out)


def run_eval(
    model: Model,
    facts: Sequence[Fact],
    scorer: Scorer,
    *,
    max_new_tokens: int = MAX_NEW_TOKENS,
    batch_size: int = BATCH_SIZE,
    progress: bool = PROGRESS,
) -> EvalRun:
    """Score ``facts`` with ``scorer`` (greedy generation of ``max_new_tokens``, KLAR's rule
    or candidate ranking; :func:`mechlingo.scoring.evaluate.evaluate_facts`), as
    ``mechlingo eval`` does."""
    result = evaluate_facts(
        model,
        facts,
        metric=scorer,
        decoding=DecodeOptions(
            max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress
        ),
    )
    return EvalRun(result, scorer)

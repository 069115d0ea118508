"""The measured circuit of ``mechlingo trace``: per language, EAP-IG edge scores
(:func:`mechlingo.analyses.circuits.find_circuit`) over the correctly answered prompts of the
trace, the circuit at a target faithfulness, and its figure drawn only from measured edges,
with the pipeline phases (:func:`~mechlingo.analyses.recall.trace_patching.pipeline_phases`) shaded.

:func:`circuit_facts` picks the clean prompts (the first ``circuit_prompts`` correctly
answered facts of the language, in trace order; the wrongly answered ones after them only
when asked for), :func:`trace_circuit` measures one language, and :class:`TraceCircuit`
holds the result with the number of prompts asked for, so a figure and a report say plainly
when fewer were available. The method: ``docs/methods/circuits.md``; where the trace draws
it: ``docs/methods/recall-pipeline.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mechlingo.analyses.circuits import CircuitResult, find_circuit
from mechlingo.core.defaults import BATCH_SIZE
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.viz.circuit import measured_circuit_figure

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from mechlingo.data import Fact

__all__ = ["CIRCUIT_METHOD", "CIRCUIT_PASSES", "CIRCUIT_STEPS", "CIRCUIT_VERIFY", "TraceCircuit",
           "circuit_facts", "trace_circuit"]  # fmt: skip

#: How the trace scores edges: EAP-IG with 5 integrated-gradient steps (as measured in
#: ``docs/methods/circuits.md``), the top 10 edges verified by exact edge patching.
CIRCUIT_METHOD, CIRCUIT_STEPS, CIRCUIT_VERIFY = "eap-ig", 5, 10
#: The cost of one prompt of the circuit, in prompt forward passes (the cost table's
#: ``prompt`` item), for the estimate: a corrupted forward, the integrated-gradient forwards
#: and a backward, the patcher's corrupted forward, one patched pass per verified edge and per
#: point of the faithfulness curve (1 + 5 + 1 + 10 + 12 passes and a backward). Measured on
#: the demo (embedded model, 36 prompts in 4 languages): 83.6 CPU s, 2.3 s per prompt, 17
#: prompt items; the passes are cheaper than a prompt item (short rows, no generation).
CIRCUIT_PASSES = 17


class Traced(Protocol):
    """What the circuit reads of a :class:`~mechlingo.analyses.recall.trace.TraceResult`:
    its per-query records (``id``, ``lang``, ``correct``)."""

    records: list[dict[str, Any]]


@dataclass
class TraceCircuit:
    """One language's measured circuit in the trace.

    Attributes:
        lang: the language.
        result: the :class:`~mechlingo.analyses.circuits.CircuitResult` (its ``n``: the
            prompts the edges were scored on, those with a corrupted partner of equal length).
        asked: the prompts asked for (``circuit_prompts``); ``available``: the clean prompts
            the language had (correctly answered ones, unless wrongly answered were allowed).
        n_unanswered: how many of the scored prompts the model answers wrongly.
        phases: the pipeline phases shaded on the figure (``{name: (first, last layer)}``).
        wrong_allowed: wrongly answered prompts could be scored too (``--patch-unanswered``).
    """

    lang: str
    result: CircuitResult
    asked: int
    available: int
    n_unanswered: int = 0
    phases: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    wrong_allowed: bool = False

    @property
    def n(self) -> int:
        """The prompts the edges were scored on."""
        return self.result.n

    def shortfall(self) -> str | None:
        """A plain sentence when fewer prompts than asked were scored (``None`` otherwise)."""
        if self.n >= self.asked:
            return None
        skipped = self.result.meta.get("skipped_without_partner", 0)
        how = (
            "clean prompt(s), wrongly answered ones included"
            if self.wrong_allowed
            else ("prompt(s) answered correctly")
        )
        return (
            f"only {self.n} of the {self.asked} prompts asked for: {self.available} "
            f"{self.lang} {how}"
            + (f", {skipped} without a corrupted partner of equal token length" if skipped else "")
        )

    def title(self) -> str:
        """The figure's title head (the figure adds n and the faithfulness)."""
        what = f"{self.lang}: measured circuit ({self.result.meta.get('method', CIRCUIT_METHOD)}"
        what += f", corrupted subject, {self.n} prompts"
        if self.n_unanswered:
            what += f", {self.n_unanswered} answered wrongly"
        if self.shortfall():
            what += f", fewer than the {self.asked} asked for"
        return what + ")"

    def figure(self) -> go.Figure:
        """The circuit drawn only from its measured edges, the phases shaded."""
        return measured_circuit_figure(
            self.result.to_json(), title=self.title(), phases=self.phases
        )

    def to_json(self) -> dict[str, Any]:
        """``circuits.json``'s record of the language: the circuit's JSON with the prompts
        asked for and available."""
        return {
            **self.result.to_json(),
            "asked": self.asked,
            "available": self.available,
            "n_unanswered": self.n_unanswered,
            "phases": {k: list(v) for k, v in self.phases.items()},
        }


def circuit_facts(
    trace: Traced, facts: Sequence[Fact], lang: str, n: int, *, unanswered: bool = False
) -> tuple[list[Fact], list[Fact], int]:
    """``(clean, pool, available)``: the first ``n`` correctly answered facts of ``lang``
    in trace order (wrongly answered ones after them with ``unanswered``), the language's
    facts to draw corrupted partners from, and how many clean candidates there were."""
    by_id = {f.id: f for f in facts if f.lang == lang}
    recs = [r for r in trace.records if r["lang"] == lang]
    order = [r for r in recs if r["correct"]]
    if unanswered:
        order += [r for r in recs if not r["correct"]]
    clean = [by_id[r["id"]] for r in order]
    return clean[:n], [by_id[r["id"]] for r in recs], len(clean)


def trace_circuit(
    model: Model,
    trace: Traced,
    facts: Sequence[Fact],
    lang: str,
    n: int,
    *,
    unanswered: bool = False,
    phases: Mapping[str, tuple[float, float]] | None = None,
    batch_size: int = BATCH_SIZE,
) -> TraceCircuit | str:
    """The measured circuit of ``lang`` from up to ``n`` clean prompts
    (:func:`circuit_facts`), or the reason there is none (a sentence): no correctly
    answered prompt, or no prompt with a corrupted partner of equal token length."""
    clean, pool, available = circuit_facts(trace, facts, lang, n, unanswered=unanswered)
    if not clean:
        return f"none of the {lang} prompts is answered correctly: no measured circuit"
    try:
        res = find_circuit(model, clean, method=CIRCUIT_METHOD, steps=CIRCUIT_STEPS,
                           pool=pool, verify=CIRCUIT_VERIFY, batch_size=batch_size)  # fmt: skip
    except InputError as err:
        return f"no measured circuit for {lang}: {err}"
    correct = {r["id"] for r in trace.records if r["lang"] == lang and r["correct"]}
    wrong = sum(fid not in correct for fid in dict.fromkeys(res.facts))
    return TraceCircuit(lang, res, asked=n, available=available, n_unanswered=wrong,
                        phases=dict(phases or {}), wrong_allowed=unanswered)  # fmt: skip

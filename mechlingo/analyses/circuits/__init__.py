"""Measured circuits: the model's computational graph (:mod:`.graph`), edge scores by EAP and
EAP-IG (:mod:`.scores`), exact edge patching (:mod:`.patching`), circuits and their
faithfulness. The method and its numbers: ``docs/methods/circuits.md``."""

from __future__ import annotations

from mechlingo.analyses.circuits.graph import Graph, Receiver, Sender, build_graph
from mechlingo.analyses.circuits.pairs import Pairs, make_pairs
from mechlingo.analyses.circuits.patching import EdgePatcher
from mechlingo.analyses.circuits.result import CircuitResult, find_circuit
from mechlingo.analyses.circuits.runs import readout_fn
from mechlingo.analyses.circuits.scores import edge_scores

__all__ = [
    "CircuitResult",
    "EdgePatcher",
    "Pairs",
    "find_circuit",
    "make_pairs",
    "Graph",
    "Receiver",
    "Sender",
    "build_graph",
    "edge_scores",
    "readout_fn",
]

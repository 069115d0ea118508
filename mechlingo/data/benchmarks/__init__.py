"""Loaders for the public multilingual fact benchmarks, as their authors ship them.

:func:`load_benchmark` reads a local file or folder (the format told from its layout, or given
with ``format=``) or a Hugging Face hub id (through ``datasets``) and returns a
:class:`Benchmark`: the :class:`~mechlingo.data.facts.Fact` records and, for every record that
could not become one, a count by reason (:data:`SKIP_REASONS`); a FLORES folder is returned as
:attr:`Benchmark.texts`. :data:`FORMATS`: ``bmlama``, ``klar``, ``klar_flat``, ``mlama``,
``mpararel``, ``mlama_rows``. The mLAMA family gets every object of the relation in the
language as candidates by default (``candidates="relation"``).

A structurally malformed file raises :class:`~mechlingo.data.facts.RecordError` or
:class:`~mechlingo.core.errors.DataError` naming the file and line; a well-formed record that
cannot become a Fact is skipped and counted, never dropped silently. Each layout, id scheme
and difference from the reference code: ``docs/benchmarks.md``."""

from __future__ import annotations

from mechlingo.data.benchmarks.bmlama import load_bmlama
from mechlingo.data.benchmarks.common import FORMATS, SKIP_REASONS, Benchmark, split_at_mask
from mechlingo.data.benchmarks.klar import load_klar, load_klar_flat
from mechlingo.data.benchmarks.load import (
    benchmark_format,
    detect_format,
    is_hub_id,
    load_benchmark,
    select,
)
from mechlingo.data.benchmarks.mlama import facts_from_rows, load_mlama, rows_from_records

__all__ = [
    "FORMATS",
    "SKIP_REASONS",
    "Benchmark",
    "benchmark_format",
    "detect_format",
    "facts_from_rows",
    "is_hub_id",
    "load_benchmark",
    "load_bmlama",
    "load_klar",
    "load_klar_flat",
    "load_mlama",
    "rows_from_records",
    "select",
    "split_at_mask",
]

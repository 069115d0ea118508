"""Loaders for the public multilingual fact benchmarks, as their authors ship them.

:func:`load_benchmark` reads a local file or folder (the format told from its layout, or
given with ``format=``) or a Hugging Face hub id (through ``datasets``), and returns a
:class:`Benchmark`: the :class:`~mechlingo.data.facts.Fact` records and, for every record
that could not become one, a count by reason (:data:`SKIP_REASONS`). Formats
(:data:`FORMATS`; ``docs/benchmarks.md`` has each layout, metric and difference):

- ``bmlama``: BMLAMA-17/53 (Qi et al. 2023), one TSV per language with the columns
  ``Prompt`` (a ``<mask>`` anywhere), ``Ans``, ``Candidate Ans`` (``", "`` between
  candidates) and ``Subject``; row ``i`` is the same fact in every file. The relation of row
  ``i`` is its English prompt with the subject replaced by ``[X]`` (a template id such as
  ``the_capital_of_x_is_y``), shared by that row in every language; fact ids are
  ``<relation>/<i>`` (``i`` counts data rows from 0, as the reference code's record files do).
- ``klar``: KLAR (Wang et al. 2025), ``klar_source/<lang>/<relation>.json`` with ``samples``
  (``subject``, ``object``, ``index``) and ``prompt_templates`` (``<subject>``, ``<mask>``;
  the first template is used, as in the reference code); ids ``<relation>/<index>``.
- ``klar_flat``: KLAR's parallel variant, ``<lang_Script>.txt`` with lines
  ``question ... The answer is: X`` (the answer follows the last colon); one relation
  ``klar``, ids ``klar/<line>``; the subject is the whole question (the files name none).
- ``mlama``: mLAMA (Kassner et al. 2021), ``<lang>/templates.jsonl`` (``relation``,
  ``template`` with ``[X]``/``[Y]``) and ``<lang>/<relation>.jsonl`` (``sub_label``,
  ``obj_label``, ``lineid``); ids ``<relation>/<lineid>``.
- ``mpararel``: mParaRel (Fierro and Søgaard 2022), ``patterns/<lang>/<relation>.jsonl``
  (``pattern``) and ``tuples/<lang>/<relation>.jsonl``.
- ``mlama_rows``: one JSONL file (or hub dataset) of flat rows as the hub exports of mLAMA and
  mParaRel hold them: ``sub_label``, ``obj_label`` (a string, or a list whose first item is
  the gold answer and the rest its aliases), ``template``, ``language``, ``predicate_id`` or
  ``relation``, ``lineid``, optional ``template_id`` and ``obj_aliases``.

The mLAMA family gets, by default, every object of the relation in the language as its
candidate set (``candidates="relation"``, the typed querying of mLAMA); ``candidates=None``
leaves the facts without candidates.

FLORES parallel text is read by :func:`mechlingo.data.parallel_text.read_parallel`;
:func:`load_benchmark` with a FLORES folder returns it as :attr:`Benchmark.texts`.

A structurally malformed file (a wrong header, invalid JSON, a row with the wrong number of
fields, files of different lengths) raises :class:`~mechlingo.data.facts.RecordError` or
:class:`~mechlingo.core.errors.DataError` naming the file and line. A well-formed record
that cannot become a Fact is skipped and counted, never dropped silently.
"""

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

"""The one scoring path: how a fact's answer is scored, with and without interventions.

:mod:`~mechlingo.analyses.scoring.evaluate` (greedy generation, the prefix rule, per-item
outcomes of many conditions on shared prefixes), :mod:`~mechlingo.analyses.scoring.rank`
(candidate ranking), :mod:`~mechlingo.analyses.scoring.scorers` (``generate``, ``rank`` and
``klar``, their rules and statistics), :mod:`~mechlingo.analyses.scoring.edits` (the first
position an intervention edits) and :mod:`~mechlingo.analyses.scoring.side_effects` (what an
intervention changes in every language). Both papers' pipelines and the card score through it.
"""

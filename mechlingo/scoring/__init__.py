"""The one scoring path: how a fact's answer is scored, with and without interventions.

A layer of its own, between :mod:`mechlingo.interventions` and :mod:`mechlingo.analyses`.

:mod:`~mechlingo.scoring.evaluate` (greedy generation, the prefix rule, per-item
outcomes of many conditions on shared prefixes), :mod:`~mechlingo.scoring.rank`
(candidate ranking), :mod:`~mechlingo.scoring.scorers` (``generate``, ``rank`` and
``klar``, their rules and statistics) and :mod:`~mechlingo.scoring.side_effects` (what an
intervention changes in every language). Both papers' pipelines and the card score through it.
"""

"""The claims card: both papers' claims checked on a model, by rules frozen before the run.

:mod:`~mechlingo.card.rules` (the claims, their families, the verdicts, the frozen rules and
their hash), :mod:`~mechlingo.card.rows` (a row from a test), :mod:`~mechlingo.card.lu` and
:mod:`~mechlingo.card.sundar` (each paper's stages and rows), :mod:`~mechlingo.card.statistics`
(the card's statistics: clustered tests valid with few clusters, random-control populations,
family adjustments) and :mod:`~mechlingo.card.replicate` (``mechlingo replicate``: the budgets,
the resumable stages, ``claims.json`` and ``claims.md``). It is one
layer above :mod:`mechlingo.analyses`, whose functions its stages call.
"""

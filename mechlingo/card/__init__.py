"""The claims card: both papers' claims checked on a model, by rules frozen before the run.

:mod:`~mechlingo.card.claims` (the claims and their families), :mod:`~mechlingo.card.rules`
(the verdicts, the frozen rules and their hash), :mod:`~mechlingo.card.stages` (one module per
stage: its name, the stages it needs, its typed budget, its run function, its row builders and
its report section), :mod:`~mechlingo.card.clustered_tests` (clustered tests valid with few clusters),
:mod:`~mechlingo.card.population` (a control as a population of random draws),
:mod:`~mechlingo.card.multiplicity` (family adjustments) and
:mod:`~mechlingo.card.replicate` (``mechlingo replicate``: the resumable stages in their
order, ``claims.json`` and ``claims.md``). It is one layer above :mod:`mechlingo.analyses`,
whose functions its stages call.
"""

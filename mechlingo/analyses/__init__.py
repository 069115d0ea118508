"""The methods, each a one-call analysis that returns a data-only result.

Recall pipeline (Lu et al.): :mod:`~mechlingo.analyses.evaluate`,
:mod:`~mechlingo.analyses.lens`, :mod:`~mechlingo.analyses.patching`,
:mod:`~mechlingo.analyses.attribution`, :mod:`~mechlingo.analyses.trace`,
:mod:`~mechlingo.analyses.repair` and its protocol :mod:`~mechlingo.analyses.protocol`.
Expert neurons (Sundar et al.): :mod:`~mechlingo.analyses.experts`,
:mod:`~mechlingo.analyses.alignment`, :mod:`~mechlingo.analyses.side_effects`.
Results draw their figures through :mod:`mechlingo.core.figures` (the drawings live in
:mod:`mechlingo.viz`).
"""

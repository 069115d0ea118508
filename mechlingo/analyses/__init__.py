"""The methods, each a one-call analysis that returns a data-only result.

Recall pipeline (Lu et al.): :mod:`~mechlingo.analyses.evaluate`,
:mod:`~mechlingo.analyses.lens`, :mod:`~mechlingo.analyses.patching`,
:mod:`~mechlingo.analyses.attribution`, :mod:`~mechlingo.analyses.trace`,
:mod:`~mechlingo.analyses.repair` and its protocol :mod:`~mechlingo.analyses.protocol`.
Expert neurons (Sundar et al.): :mod:`~mechlingo.analyses.experts`,
:mod:`~mechlingo.analyses.align`, :mod:`~mechlingo.analyses.side_effects`.
A result's ``fig_*`` methods call the drawing functions of :mod:`mechlingo.viz` (a layer
below) directly, with the arrays the result holds.
"""

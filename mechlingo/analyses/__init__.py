"""The methods, each a one-call analysis that returns a data-only result, in four rooms.

* :mod:`~mechlingo.analyses.scoring` -- the one scoring path every method shares: greedy
  generation and its prefix rule (:mod:`~mechlingo.analyses.scoring.evaluate`), candidate
  ranking (:mod:`~mechlingo.analyses.scoring.rank`), the three scorers behind ``--metric``
  (:mod:`~mechlingo.analyses.scoring.scorers`), many interventions on shared prefixes
  (:func:`~mechlingo.analyses.scoring.evaluate.evaluate_conditions`) and the side effects of
  an intervention (:mod:`~mechlingo.analyses.scoring.side_effects`).
* :mod:`~mechlingo.analyses.decoders` -- reading the residual stream at every entry: the
  logit lens, tuned lenses, the patchscope, and their comparison.
* :mod:`~mechlingo.analyses.recall` -- the English-pivot recall pipeline (Lu et al.): the
  trace, activation patching, attribution patching, the steering vectors, their evaluation
  (``steer eval``) and the transfer matrix.
* :mod:`~mechlingo.analyses.experts` -- expert neurons and the embedding space (Sundar et
  al.): neuron statistics, selection, the k curve and cross-lingual alignment.

The claims card that checks both papers (:mod:`mechlingo.card`) is a layer above. A result's
``fig_*`` methods call the drawing functions of :mod:`mechlingo.viz` (a layer below) directly,
with the arrays the result holds.
"""

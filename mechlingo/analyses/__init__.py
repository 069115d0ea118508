"""The methods, each a one-call analysis that returns a data-only result, in three rooms.

* :mod:`~mechlingo.analyses.decoders` -- reading the residual stream at every entry: the
  logit lens, tuned lenses, the patchscope, and their comparison.
* :mod:`~mechlingo.analyses.recall` -- the English-pivot recall pipeline (Lu et al.): the
  trace, activation patching, attribution patching, the steering vectors, their evaluation
  (``steer eval``) and the transfer matrix.
* :mod:`~mechlingo.analyses.experts` -- expert neurons and the embedding space (Sundar et
  al.): neuron statistics, selection, the k curve and cross-lingual alignment.

They score facts through :mod:`mechlingo.scoring`, the layer below (one scoring path for
every method); the claims card that checks both papers (:mod:`mechlingo.card`) is the layer
above. A result's ``fig_*`` methods call the drawing functions of :mod:`mechlingo.viz` (a
layer below) directly, with the arrays the result holds.
"""

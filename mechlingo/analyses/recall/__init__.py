"""The English-pivot factual recall pipeline of Lu et al. (EMNLP 2025), end to end.

1. :mod:`~mechlingo.analyses.recall.trace` -- ``mechlingo trace``: accuracy, the latent
   language per layer (through a decoder), language patching and the error classes.
2. :mod:`~mechlingo.analyses.recall.patching` and :mod:`~mechlingo.analyses.recall.attribution`
   -- activation patching over cells, attention knockout, and its gradient approximation.
3. :mod:`~mechlingo.analyses.recall.steering` -- ``steer build``: the recall-engagement
   (``task``) and back-translation (``diff``) steering vectors, :class:`~mechlingo.analyses.recall.steering.SteeringPair`.
4. :mod:`~mechlingo.analyses.recall.steer_eval` -- ``steer eval``: layers and scales chosen on
   dev, the conditions scored on held-out test facts against a random control.
5. :mod:`~mechlingo.analyses.recall.transfer` -- the transfer matrix: vectors built on one
   relation or language, measured on another.
"""

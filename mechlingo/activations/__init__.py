"""Running the model and collecting what it computes: hooked runs and streaming class means
(:mod:`~mechlingo.activations.runs`), pooled neuron statistics
(:mod:`~mechlingo.activations.pooled`), KV-cached decoding and the passes that reuse a cached
prefix (:mod:`~mechlingo.activations.decoding`), line likelihoods and samples
(:mod:`~mechlingo.activations.likelihood`); runs split over processes under torchrun use
:mod:`mechlingo.core.distributed`.
"""

"""Running the model and collecting what it computes: hooked runs
(:mod:`~mechlingo.activations.runs`), pooled neuron statistics
(:mod:`~mechlingo.activations.pooled`), class means (:mod:`~mechlingo.activations.runs`),
KV-cached decoding (:mod:`~mechlingo.activations.decoding`) and runs split over processes under
torchrun (:mod:`~mechlingo.activations.distributed`).
"""

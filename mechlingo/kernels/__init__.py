"""Numerical kernels that take tensors (and at most a model's weights), never run a model:
the chunked unembedding readout (:mod:`~mechlingo.kernels.readout`) and the exact screened
greedy arg-max (:mod:`~mechlingo.kernels.argmax`), neuron ranking
(:mod:`~mechlingo.kernels.ranking`: AUROC, average precision, LAPE, top-k), streaming
accumulators (:mod:`~mechlingo.kernels.streaming`: pooling, streaming means, firing rates),
and confidence intervals and tests (:mod:`~mechlingo.kernels.significance`)."""

# Submodules documented in the API reference.
__all__ = ["argmax", "ranking", "readout", "significance", "streaming"]

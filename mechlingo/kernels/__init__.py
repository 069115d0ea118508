"""Numerical kernels that take tensors (and at most a model's weights), never run a model:
the chunked unembedding readout (:mod:`~mechlingo.kernels.readout`) and the exact screened
greedy arg-max (:mod:`~mechlingo.kernels.argmax`), neuron ranking and streaming
accumulators (:mod:`~mechlingo.kernels.stats`: AUROC, average precision, LAPE, streaming
means), and confidence intervals and tests (:mod:`~mechlingo.kernels.significance`)."""

# Submodules documented in the API reference.
__all__ = ["argmax", "readout", "significance", "stats"]

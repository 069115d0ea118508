"""Decoders of the residual stream: what the model "has in mind" at every entry.

:mod:`~mechlingo.analyses.decoders.registry` (the decoder interface and the registry every
command reads), :mod:`~mechlingo.analyses.decoders.entries` (the entries every decoder reads),
:mod:`~mechlingo.analyses.decoders.lens` (the lens per language, and the one call
``lens_facts`` that runs any decoder over facts), the decoders themselves, each registering
itself in its own module: :mod:`~mechlingo.analyses.decoders.logit` (the logit lens),
:mod:`~mechlingo.analyses.decoders.tuned_lens` (affine translators per entry, trained and held
out; the interop with the ``tuned-lens`` package in
:mod:`~mechlingo.analyses.decoders.tuned_lens_interop`) and
:mod:`~mechlingo.analyses.decoders.patchscope`; and
:mod:`~mechlingo.analyses.decoders.compare` (several decoders on the same prompts, and where
the English answer leads).
"""

# Importing the package registers the shipped decoders, in this order (the default first).
from mechlingo.analyses.decoders import logit, tuned_lens, patchscope  # noqa: F401, I001

"""Decoders of the residual stream: what the model "has in mind" at every entry.

:mod:`~mechlingo.analyses.decoders.entries` (the entries every decoder reads),
:mod:`~mechlingo.analyses.decoders.lens` (the logit lens per language, and the one call
``lens_facts`` that runs any decoder over facts), :mod:`~mechlingo.analyses.decoders.tuned_lens`
(affine translators per entry, trained and held out), the interop with the ``tuned-lens``
package (:mod:`~mechlingo.analyses.decoders.tuned_lens_interop`),
:mod:`~mechlingo.analyses.decoders.patchscope` and
:mod:`~mechlingo.analyses.decoders.compare` (several decoders on the same prompts, and where
the English answer leads).
"""

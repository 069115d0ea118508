"""Figures (plotly), drawn from plain data: tensors, lists, dicts, floats, strings.

One module per analysis: :mod:`~mechlingo.viz.lens` (the lenses and decoders),
:mod:`~mechlingo.viz.trace` (the recall-pipeline trace), :mod:`~mechlingo.viz.patching`
(patching heatmaps, attention knockout, the circuit diagram), :mod:`~mechlingo.viz.evaluate`
(accuracy bars), :mod:`~mechlingo.viz.steer` (the steering evaluation and the transfer
matrix), :mod:`~mechlingo.viz.experts`, :mod:`~mechlingo.viz.side_effects` and
:mod:`~mechlingo.viz.align`; :mod:`~mechlingo.viz.common` holds the shared helpers and
:mod:`~mechlingo.viz.palette` the one colour of each concept (trace class, language, decoder,
condition), which every figure takes its colours from.

viz sits below the analyses: it imports nothing from activations, interventions, analyses,
report or cli, and plotly only inside the functions that draw (so importing an analysis
does not load plotly). A result's ``fig_*`` method calls the function here with the arrays
it holds, e.g. ``LensResult.fig_heatmap`` calls :func:`mechlingo.viz.lens.lens_heatmap`.
"""

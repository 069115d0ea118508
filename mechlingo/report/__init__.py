"""Self-contained HTML reports and the atomic writing of a command's outputs.

:mod:`~mechlingo.report.page` has :class:`Report` and :func:`write_outputs`; each command's
report is built from its results by one function: :func:`~mechlingo.report.lens.lens_report`,
:func:`~mechlingo.report.evaluate.eval_report`, :func:`~mechlingo.report.trace.trace_report`,
:func:`~mechlingo.report.steer.repair_report`, :func:`~mechlingo.report.experts.experts_report`
and :func:`~mechlingo.report.experts.align_report`.
"""

from mechlingo.report.page import Report, write_outputs

__all__ = ["Report", "write_outputs"]

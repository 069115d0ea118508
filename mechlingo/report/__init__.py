"""Self-contained HTML reports and the atomic writing of a command's outputs."""

from mechlingo.report.page import Report, write_outputs

__all__ = ["Report", "write_outputs"]

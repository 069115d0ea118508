"""The report of ``mechlingo lens --decoder ...``: several decoders side by side."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mechlingo.analyses.decoders.compare import DecoderComparison
from mechlingo.report.page import Report, fmt_interval


def decoders_report(comparison: DecoderComparison, summary: Mapping[str, Any]) -> Report:
    """The decoder comparison: the latent-language curves, entropy and token energy of every
    decoder side by side, and the table of where the English answer leads.

    ``comparison`` is a :class:`mechlingo.analyses.decoders.compare.DecoderComparison`.
    """
    report = Report("mechlingo: the lens under several decoders", summary["meta"])
    for r in (summary.get("english_lead") or [])[:5]:
        report.add_headline(f"English answer leads at some layer: {r.get('decoder')}, "
                            f"{r.get('lang')}", fmt_interval(r.get("ever"), r.get("ever_lo"),
                                                             r.get("ever_hi"), r.get("n")))  # fmt: skip
    if not report.headline:
        report.add_headline("Decoders", ", ".join(map(str, summary.get("decoders", []))) or "n/a")
    report.add_text(
        "Every decoder reads the same prompts at the same layers: the logit lens (final norm "
        "and unembedding), tuned lenses (a trained affine translator per layer first) and the "
        "patchscope (the state patched into an identity prompt, read by the model's remaining "
        "layers). If the English answer leads the prompt-language answer in the middle layers "
        "under every decoder, the English pivot is not an artifact of the logit lens.",
        note=True,
    )
    report.add_heading("Latent-language curves per decoder")
    report.add_figure(comparison.fig_curves())
    rows = summary.get("english_lead")
    if rows:
        report.add_heading("Where the English answer leads (prompts whose answers differ)")
        keep = ("decoder", "lang", "n", "ever", "ever_lo", "ever_hi", "first_layer",
                "first_lo", "first_hi", "range")  # fmt: skip
        report.add_table([{k: r.get(k) for k in keep} for r in rows])
    return report

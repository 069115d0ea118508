"""The report of ``mechlingo lens``: the per-language logit lens."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mechlingo.analyses.decoders.lens import LensResult
from mechlingo.core.errors import InputError
from mechlingo.report.page import Report


def lens_report(result: LensResult, summary: Mapping[str, Any], *, max_rank: int) -> Report:
    """The lens report: a summary table per language, the latent-language curves and the
    per-layer rank heatmaps of the English and the prompt-language answers.

    ``result`` is a :class:`mechlingo.analyses.decoders.lens.LensResult`, ``summary`` its
    ``summary(max_rank=max_rank)`` with ``meta`` added.
    """
    report = Report("mechlingo: per-language logit lens", summary["meta"])
    n = summary["n_prompts"]
    report.add_headline("Prompts", f"{sum(n.values())} in {len(n)} languages ({', '.join(n)})")
    for key, label in (
        ("final_layer_accuracy", "Final-layer top-1 accuracy"),
        (
            "english_decodable_before_last",
            f"English answer rank <= {max_rank} before the last layer",
        ),
    ):
        vals = summary[key]
        lows = sorted(n, key=lambda lg: vals.get(lg, 0.0))
        report.add_headline(f"{label} (per language, lowest first)",
                            ", ".join(f"{lg} {vals.get(lg, 0.0):.2f}" for lg in lows[:6]))  # fmt: skip
    report.add_text(
        "Each prompt's residual stream at its last token is decoded after every layer through "
        "the final norm and unembedding. Curves show the probability of the answer in the "
        "prompt's language and in the tracked languages. A rise of the English answer in the "
        "middle layers before the prompt-language answer is the English pivot.",
        note=True,
    )
    report.add_heading("Summary")
    report.add_table(
        [
            {
                "lang": lg,
                "prompts": summary["n_prompts"][lg],
                "final-layer top-1 accuracy": summary["final_layer_accuracy"].get(lg, 0.0),
                f"English answer rank <= {max_rank} before the last layer": summary[
                    "english_decodable_before_last"
                ].get(lg, 0.0),
            }
            for lg in summary["n_prompts"]
        ]
    )
    report.add_heading("Latent-language curves")
    report.add_figure(result.fig_latent_curves())
    if "en" in result.tracks:
        report.add_heading("English answer rank per layer and prompt")
        report.add_figure(result.fig_heatmap("en", "rank"))
    report.add_heading("Prompt-language answer rank per layer and prompt")
    report.add_figure(result.fig_heatmap("answer", "rank"))
    return report


def token_lens_report(result: LensResult, meta: Mapping[str, Any]) -> Report:
    """The token-level lens of each prompt (``result`` read without answers, or with
    ``tokens=True``): per prompt its grid coloured by the top token's probability and by its
    language."""
    report = Report(f"mechlingo: token-level {result.decoder} lens", meta)
    grid = result.tokens
    if grid is None:
        raise InputError(
            "the lens did not read every position", fix="call logit_lens(..., tokens=True)"
        )
    report.add_headline(
        "Prompts", f"{len(result.prompts)}; layers {grid.layers[0]}..{grid.layers[-1]}"
    )
    report.add_text(
        "Each cell is the most likely next token when the residual stream after that many "
        "blocks, at that position, is decoded through the final norm and the unembedding "
        "(or the chosen decoder). Hover a cell for the top tokens in full, their "
        "probabilities and the language each looks like for the prompt's language and "
        "English: its script, else its word in the bundled templates and names; shared: "
        "written the same in several languages (numbers, punctuation, most names); none: a "
        "word piece nothing places. A long prompt wraps onto several panels. The last row is "
        "the model's own prediction.",
        note=True,
    )
    for p, prompt in enumerate(result.prompts):
        report.add_heading(f"Prompt {p + 1} ({result.langs[p]}): {prompt[:80]}")
        report.add_figure(result.fig_tokens(p, "prob"))
        report.add_figure(result.fig_tokens(p, "lang"))
    return report

"""plotly figures for the decoders beside the logit lens: the tuned lens's loss curve, the
held-out KL per layer, and the latent-language curves of several decoders side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from mechlingo.core.figures import drawer
from mechlingo.viz.common import PALETTE, band

if TYPE_CHECKING:
    from mechlingo.analyses.lens import LensResult
    from mechlingo.analyses.tuned_lens import TunedLensTraining

__all__ = ["decoder_curves_figure", "lens_kl_figure", "tuned_lens_loss_figure"]


@drawer
def tuned_lens_loss_figure(training: TunedLensTraining) -> go.Figure:
    """Training KL(final || lens) per step, one line per lens entry (log axis), and the
    mean over entries in black."""
    loss = training.loss
    steps = list(range(1, loss.shape[0] + 1))
    fig = go.Figure()
    n = loss.shape[1]
    for e in range(n):
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=loss[:, e].tolist(),
                mode="lines",
                name=f"entry {e}",
                line={"width": 1, "color": PALETTE[e % len(PALETTE)]},
            )  # fmt: skip
        )
    fig.add_trace(go.Scatter(x=steps, y=loss.mean(1).tolist(), mode="lines", name="mean",
                             line={"width": 3, "color": "black"}))  # fmt: skip
    fig.update_layout(
        title=f"Tuned lens training: KL(final || lens) per step ({sum(training.tokens)} tokens, "
        f"{training.seconds:.0f} s, {training.world_size} process(es))",
        xaxis={"title": "step"},
        yaxis={"title": "KL (nats), training batch", "type": "log"},
        height=450,
    )
    return fig


@drawer
def lens_kl_figure(div: Mapping[str, Any]) -> go.Figure:
    """Held-out KL(final || decoder) per entry with 95% bootstrap bands, one line per decoder
    (the output of :func:`mechlingo.analyses.tuned_lens.lens_divergence`)."""
    fig = go.Figure()
    x = list(div["entries"])
    for j, (name, d) in enumerate(div["decoders"].items()):
        color = PALETTE[j % len(PALETTE)]
        lo = [v if v is not None else m for v, m in zip(d["lo"], d["kl"], strict=True)]
        hi = [v if v is not None else m for v, m in zip(d["hi"], d["kl"], strict=True)]
        fig.add_trace(band(x, lo, hi, color))
        fig.add_trace(go.Scatter(x=x, y=d["kl"], mode="lines+markers", name=name,
                                 line={"color": color}))  # fmt: skip
    fig.update_layout(
        title=f"Held-out KL(final || decoder) per layer (n = {div['n_texts']} texts, "
        f"{div['n_tokens']} tokens; 95% bootstrap over texts)",
        xaxis={"title": "layer (blocks applied)", "dtick": 1},
        yaxis={"title": "KL (nats)", "type": "log"},
        height=450,
    )
    return fig


def _rows(result: LensResult, langs: Sequence[str]) -> torch.Tensor:
    return torch.tensor([i for i, lg in enumerate(result.langs) if lg in set(langs)])


def _mean_band(v: torch.Tensor) -> tuple[list[float], list[float], list[float]]:
    """Mean over prompts per entry with a normal-approximation 95% band."""
    m = v.mean(1)
    se = v.std(1) / max(1, v.shape[1]) ** 0.5 if v.shape[1] > 1 else torch.zeros_like(m)
    return m.tolist(), (m - 1.96 * se).tolist(), (m + 1.96 * se).tolist()


def _panel_values(result: LensResult, idx: torch.Tensor, row: str, track: str) -> torch.Tensor:
    if row == "probability":
        return result.logprob[:, idx, result.track_index(track)].exp()
    if row == "rank":
        return torch.log10(result.rank[:, idx, result.track_index(track)].float() + 1)
    values = result.entropy if row == "entropy" else result.energy
    return (
        values[:, idx]
        if values is not None
        else torch.full((len(result.layers), len(idx)), float("nan"))
    )


_ROWS = ("probability", "rank", "entropy", "energy")
_Y_TITLES = {"probability": "probability", "rank": "log10(rank + 1)",
             "entropy": "entropy (nats)", "energy": "token energy"}  # fmt: skip


@drawer
def decoder_curves_figure(
    results: Mapping[str, LensResult], *, langs: Sequence[str] | None = None
) -> go.Figure:
    """The latent-language curves of every decoder side by side: one column per decoder;
    rows: probability and rank of the answer in the prompt language and in English
    (mean over prompts, 95% band), then the decoder's entropy and token energy per layer.
    Pools the prompts of ``langs`` (default: every language but English)."""
    names = list(results)
    first = results[names[0]]
    if langs is None:
        langs = [lg for lg in dict.fromkeys(first.langs) if lg != "en"] or list(first.langs)
    n_prompts = int(len(_rows(first, langs)))
    fig = make_subplots(rows=len(_ROWS), cols=len(names), shared_xaxes=True,
                        shared_yaxes="rows", subplot_titles=names,
                        vertical_spacing=0.05, horizontal_spacing=0.03)  # fmt: skip
    colors = {"answer": PALETTE[0], "en": PALETTE[1], "entropy": PALETTE[2], "energy": PALETTE[3]}
    for c, name in enumerate(names, start=1):
        res = results[name]
        idx = _rows(res, langs)
        x = list(res.layers)
        for r, row in enumerate(_ROWS, start=1):
            tracks = ["answer", "en"] if row in ("probability", "rank") else [row]
            for track in tracks:
                if track in ("answer", "en") and track not in res.tracks:
                    continue
                m, lo, hi = _mean_band(_panel_values(res, idx, row, track))
                label = {"answer": "prompt-language answer", "en": "English answer"}.get(
                    track, track
                )
                fig.add_trace(band(x, lo, hi, colors[track]), row=r, col=c)
                fig.add_trace(go.Scatter(x=x, y=m, mode="lines+markers", marker={"size": 3},
                                         line={"color": colors[track]}, name=label,
                                         legendgroup=track, showlegend=c == 1 and r != 2),
                              row=r, col=c)  # fmt: skip
    for r, row in enumerate(_ROWS, start=1):
        fig.update_yaxes(title_text=_Y_TITLES[row], row=r, col=1)
        if row == "rank":
            fig.update_yaxes(autorange="reversed", row=r)
    fig.update_xaxes(title_text="layer (blocks applied)", row=len(_ROWS))
    fig.update_layout(
        title=f"Latent-language curves per decoder (prompts in {', '.join(langs)}; n = "
        f"{n_prompts}; mean, 95% band)",
        height=220 * len(_ROWS) + 120,
        legend={"orientation": "h", "y": -0.08},
    )
    return fig

"""Figures of the lenses: the latent-language curves, the per-prompt lens heatmap, the tuned
lens's loss curve, the held-out KL per layer, and the curves of several decoders side by
side. Every function takes plain data (tensors, lists, dicts, a data frame)."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.core.errors import InputError
from mechlingo.viz.common import band, plain, rank_axis, track_label
from mechlingo.viz.palette import (
    PROBABILITY,
    RANK,
    SEQUENCE,
    decoder_color,
    language_color,
    track_color,
)

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = [
    "DecoderPanel",
    "decoder_curves_figure",
    "latent_curves_figure",
    "lens_heatmap",
    "lens_kl_figure",
    "token_grid_figure",
    "tuned_lens_loss_figure",
]


def _curve_band(d: pd.DataFrame) -> tuple[Any, Any, Any, str]:
    """A track's line and band: the median and interquartile range when ``d`` has them
    (inside [0, 1] by construction), else the mean and mean ± s.d. clipped to [0, 1]."""
    if {"median", "q25", "q75"} <= set(d.columns):
        return d["median"], d["q25"], d["q75"], "median, interquartile band"
    lo = (d["mean"] - d["std"]).clip(lower=0, upper=1)
    hi = (d["mean"] + d["std"]).clip(lower=0, upper=1)
    return d["mean"], lo, hi, "mean ± s.d., clipped to [0, 1]"


def latent_curves_figure(
    curves: pd.DataFrame, *, tracks: Sequence[str] | None = None, n_layers: int | None = None
) -> go.Figure:
    """One panel per prompt language; per track the median probability over prompts per
    lens entry with its interquartile band. ``curves`` has the columns ``lang``, ``track``,
    ``layer`` and ``median``, ``q25``, ``q75`` (:meth:`LensResult.latent_curves`; older
    tables with only ``mean`` and ``std`` draw the mean ± s.d. clipped to [0, 1]) and
    ``count`` (the n of each panel's title, when present)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    langs = sorted(curves["lang"].unique())
    tracks = list(tracks) if tracks else list(dict.fromkeys(curves["track"]))
    cols = min(4, len(langs))
    rows = math.ceil(len(langs) / cols)

    def n_of(lg: str) -> str:
        if "count" not in curves.columns:
            return ""
        return f" (n = {int(curves[curves['lang'] == lg]['count'].max())})"

    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[f"prompts in {lg}{n_of(lg)}" for lg in langs],
        horizontal_spacing=0.05,
        vertical_spacing=0.14 if rows > 1 else 0.08,
    )
    how = "median, interquartile band"
    for i, lg in enumerate(langs):
        r, c = i // cols + 1, i % cols + 1
        for track in tracks:
            d = curves[(curves["lang"] == lg) & (curves["track"] == track)].sort_values("layer")
            if d.empty:
                continue
            color = track_color(track)
            mid, lo, hi, how = _curve_band(d)
            fig.add_trace(band(d["layer"], lo, hi, color, legendgroup=track), row=r, col=c)
            fig.add_trace(
                go.Scatter(
                    x=d["layer"],
                    y=mid,
                    mode="lines+markers",
                    name=track_label(track),
                    line={"color": color},
                    marker={"size": 4},
                    legendgroup=track,
                    showlegend=i == 0,
                ),
                row=r,
                col=c,
            )
    fig.update_yaxes(range=[0, 1], title_text="probability")
    fig.update_xaxes(title_text="layer (blocks applied)")
    n = ""
    if "count" in curves.columns:
        n = f"; n = {sum(int(curves[curves['lang'] == lg]['count'].max()) for lg in langs)} prompts"
    fig.update_layout(
        title=f"Latent-language curves: probability of the answer per layer ({how}{n})",
        height=300 * rows + 80,
        margin={"t": 80, "l": 60, "r": 20, "b": 50},
        legend={"orientation": "h", "y": -0.3 if rows == 1 else -0.1},
    )
    return fig


def lens_heatmap(
    rank: Int[Tensor, "layer prompt"],
    logprob: Float[Tensor, "layer prompt"],
    *,
    layers: Sequence[int],
    prompts: Sequence[str],
    langs: Sequence[str],
    answers: Sequence[str],
    top_tokens: Sequence[Sequence[Sequence[str] | None]],
    track: str = "en",
    value: str = "rank",
) -> go.Figure:
    """Layer-by-prompt heatmap of one track: ``log10(rank + 1)`` (bright = near the top) or
    the probability ``exp(logprob)``.

    Args:
        rank, logprob: the track's rank (0 = top-1) and log-probability per entry and prompt.
        layers: the lens entries (x axis); prompts, langs, answers: per prompt (the y labels
            and the hover); top_tokens: ``[layer][prompt]`` the decoded top tokens (the
            first one is shown in the hover); track: the track's name (title).
    """
    import plotly.graph_objects as go

    what = track_label(track)
    if value == "rank":
        z = torch.log10(rank.float() + 1).T
        colorbar = f"rank of the {what}<br>(log10 of rank + 1)"
        scale = RANK
    elif value == "prob":
        z = logprob.exp().T
        colorbar = f"probability of the<br>{what}"
        scale = PROBABILITY
    else:
        raise InputError("value must be 'rank' or 'prob'")
    labels = [plain(f"{i}:{langs[i]} {answers[i]}") for i in range(len(prompts))]
    text = [
        [
            f"{plain(repr(prompts[p][-40:]))}<br>top: {plain(repr((top_tokens[li][p] or [''])[0]))}"
            f"<br>rank {int(rank[li, p])}"
            for li in range(len(layers))
        ]
        for p in range(len(prompts))
    ]
    fig = go.Figure(
        go.Heatmap(
            z=z.tolist(),
            x=list(layers),
            y=labels,
            colorscale=scale,
            colorbar={"title": colorbar},
            hovertext=text,
            hoverinfo="text+z",
        )
    )
    word = "rank" if value == "rank" else "probability"
    fig.update_layout(
        title=f"Logit lens: {word} of the {what} per layer and prompt (n = {len(prompts)})",
        xaxis={"title": "layer (blocks applied)", "dtick": 1},
        yaxis={"title": "prompt (index: language, answer)"},
        height=max(300, 14 * len(labels) + 120),
        margin={"l": 220},
    )
    return fig


def tuned_lens_loss_figure(
    loss: Float[Tensor, "step entry"], *, n_tokens: int, seconds: float, world_size: int
) -> go.Figure:
    """Training KL(final || lens) per step, one line per lens entry (log axis), and the
    mean over entries in black; the title gives the tokens, seconds and processes."""
    import plotly.graph_objects as go

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
                line={"width": 1, "color": SEQUENCE[e % len(SEQUENCE)]},
            )  # fmt: skip
        )
    fig.add_trace(go.Scatter(x=steps, y=loss.mean(1).tolist(), mode="lines", name="mean",
                             line={"width": 3, "color": "black"}))  # fmt: skip
    fig.update_layout(
        title=f"Tuned lens training: KL(final || lens) per step (n = {n_tokens} tokens, "
        f"{seconds:.0f} s, {world_size} process(es))",
        xaxis={"title": "step"},
        yaxis={"title": "KL (nats), training batch", "type": "log"},
        height=450,
    )
    return fig


def lens_kl_figure(div: Mapping[str, Any]) -> go.Figure:
    """Held-out KL(final || decoder) per entry with 95% bootstrap bands, one line per decoder
    (the output of :func:`mechlingo.analyses.decoders.tuned_lens.lens_divergence`)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    x = list(div["entries"])
    for name, d in div["decoders"].items():
        color = decoder_color(name)
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


@dataclass(frozen=True)
class DecoderPanel:
    """One decoder's numbers over the pooled prompts, for :func:`decoder_curves_figure`.

    Attributes:
        layers: the lens entries (x axis).
        logprob, rank: per track (``"answer"``: the prompt-language answer, ``"en"``: the
            English one; a missing track is not drawn) ``[layer, prompt]`` log-probability
            and rank (0 = top-1).
        entropy, energy: ``[layer, prompt]`` the decoder's entropy (nats) and token energy
            (NaN where not measured).
    """

    layers: Sequence[int]
    logprob: Mapping[str, Float[Tensor, "layer prompt"]]
    rank: Mapping[str, Int[Tensor, "layer prompt"]]
    entropy: Float[Tensor, "layer prompt"]
    energy: Float[Tensor, "layer prompt"]

    def values(self, row: str, track: str) -> Float[Tensor, "layer prompt"]:
        """What panel ``row`` draws for ``track``: the probability, ``rank + 1`` (drawn on a
        reversed log axis), the entropy or the energy."""
        if row == "probability":
            return self.logprob[track].exp()
        if row == "rank":
            return self.rank[track].float() + 1
        return self.entropy if row == "entropy" else self.energy


def _median_band(v: torch.Tensor) -> tuple[list[float], list[float], list[float]]:
    """Median over prompts per entry with the interquartile band (NaN entries ignored), so a
    band of probabilities stays in [0, 1] and one of ranks stays positive."""
    q = torch.nanquantile(v.double(), torch.tensor([0.5, 0.25, 0.75], dtype=torch.float64), dim=1)
    return q[0].tolist(), q[1].tolist(), q[2].tolist()


_ROWS = ("probability", "rank", "entropy", "energy")
_Y_TITLES = {"probability": "probability", "rank": "rank + 1",
             "entropy": "entropy (nats)", "energy": "token energy"}  # fmt: skip


def decoder_curves_figure(
    panels: Mapping[str, DecoderPanel], *, langs: Sequence[str], n_prompts: int
) -> go.Figure:
    """The latent-language curves of every decoder side by side: one column per decoder
    (``panels``, in order); rows: probability and rank of the answer in the prompt language
    and in English (median over prompts, interquartile band), then the decoder's entropy and token
    energy per layer. ``langs`` and ``n_prompts`` (the pooled prompts) go into the title."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(panels)
    fig = make_subplots(rows=len(_ROWS), cols=len(names), shared_xaxes=True,
                        shared_yaxes="rows", subplot_titles=names,
                        vertical_spacing=0.05, horizontal_spacing=0.03)  # fmt: skip
    for c, name in enumerate(names, start=1):
        panel = panels[name]
        x = list(panel.layers)
        for r, row in enumerate(_ROWS, start=1):
            tracks = ["answer", "en"] if row in ("probability", "rank") else [row]
            for track in tracks:
                if track in ("answer", "en") and track not in panel.logprob:
                    continue
                m, lo, hi = _median_band(panel.values(row, track))
                label = track_label(track) if track in ("answer", "en") else track
                fig.add_trace(band(x, lo, hi, track_color(track)), row=r, col=c)
                fig.add_trace(go.Scatter(x=x, y=m, mode="lines+markers", marker={"size": 3},
                                         line={"color": track_color(track)}, name=label,
                                         legendgroup=track, showlegend=c == 1 and r != 2),
                              row=r, col=c)  # fmt: skip
    worst = max((float(p.rank[t].max()) + 1 for p in panels.values() for t in p.rank), default=2)
    for r, row in enumerate(_ROWS, start=1):
        fig.update_yaxes(title_text=_Y_TITLES[row], row=r)
        if row == "rank":
            rank_axis(fig, worst, title=_Y_TITLES[row], row=r)
        if row == "probability":
            fig.update_yaxes(range=[0, 1], row=r)
    fig.update_xaxes(title_text="layer (blocks applied)")
    fig.update_layout(
        title=f"Latent-language curves per decoder (prompts in {', '.join(langs)}; n = "
        f"{n_prompts}; median, interquartile band)",
        height=220 * len(_ROWS) + 120,
        legend={"orientation": "h", "y": -0.08},
    )
    return fig


#: The colour of a token no language can be told for ("none") in the grid coloured by language.
NO_LANGUAGE = "#e8e8e8"
#: The colour of a token written the same in several languages ("shared": numbers,
#: punctuation, most names).
SHARED_LANGUAGE = "#b8b0a0"
#: Input positions per panel of the token grid: a longer prompt wraps onto more panels.
POSITIONS_PER_PANEL = 12
#: The token grid's width at most (pixels), so its colour bar stays on a report's page.
MAX_GRID_WIDTH = 1100


def _cell_label(token: str, width: int = 8) -> str:
    """A top token as a cell's text: spaces shown as ``·``, newlines as ``⏎``, cut to
    ``width`` characters (the whole token is in the hover), escaped for plotly's HTML."""
    t = token.replace(" ", "\u00b7").replace("\n", "\u23ce")
    return html.escape(t if len(t) <= width else t[: width - 1] + "\u2026", quote=False)


def lang_label(lang: str | None) -> str:
    """How a token's language reads on the page and in the hover: its code, ``"shared"``,
    or ``"none"`` (no language can be told)."""
    return lang or "none"


def _hover(tokens: Sequence[str], probs: Sequence[float], langs: Sequence[str | None]) -> str:
    """The hover of one cell: each top token in full (escaped), its probability and
    language."""
    return "<br>".join(
        f"{html.escape(repr(t), quote=False)} {p:.3f} ({lang_label(lg)})"
        for t, p, lg in zip(tokens, probs, langs, strict=True)
    )


def _lang_colours(
    top_langs: Sequence[Sequence[Sequence[str | None]]],
) -> tuple[dict[str, int], dict[str, Any]]:
    """The codes of the top tokens' languages (none 0, shared 1, then each language) and
    the colour axis that draws them."""
    names = sorted({lg for row in top_langs for cell in row if (lg := cell[0])} - {"shared"})
    codes = {"": 0, "shared": 1, **{lg: k + 2 for k, lg in enumerate(names)}}
    colours = [NO_LANGUAGE, SHARED_LANGUAGE] + [language_color(lg) for lg in names]
    n = len(colours)
    scale = [[b / n, c] for k, c in enumerate(colours) for b in (k, k + 1)]
    axis = {"colorscale": scale, "cmin": -0.5, "cmax": n - 0.5,
            "colorbar": {"title": {"text": "language of<br>the top token"},
                         "tickvals": list(range(n)), "ticktext": ["none", "shared", *names]}}  # fmt: skip
    return codes, axis


def token_grid_figure(
    tokens: Sequence[str],
    top_tokens: Sequence[Sequence[Sequence[str]]],
    top_probs: Float[Tensor, "entry position k"],
    top_langs: Sequence[Sequence[Sequence[str | None]]],
    *,
    layers: Sequence[int],
    color: str = "prob",
    decoder: str = "logit",
    prompt_lang: str | None = None,
    per_panel: int = POSITIONS_PER_PANEL,
) -> go.Figure:
    """The token-level lens of one prompt as heatmaps: input positions (x, labelled with
    their tokens) by lens entries (y); each cell shows the entry's top next token there (cut
    to 8 characters; the hover has every top token in full, its probability and language).
    A prompt longer than ``per_panel`` positions wraps onto more panels, one under the
    other, so the figure stays at most :data:`MAX_GRID_WIDTH` pixels wide and its one
    colour bar (a shared colour axis) stays beside the cells.

    Args:
        tokens: the prompt's input tokens.
        top_tokens, top_probs, top_langs: ``[entry][position][k]`` the top tokens, their
            probabilities and their languages (``"shared"``; ``None``: none).
        layers: the entries (y axis).
        color: ``"prob"`` (the top token's probability, 0..1) or ``"lang"`` (its language,
            in the palette's language colour; grey: none, beige: shared).
        decoder, prompt_lang: for the title.
        per_panel: input positions per panel (at least 1).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if color not in ("prob", "lang"):
        raise InputError("color must be 'prob' or 'lang'")
    if per_panel < 1:
        raise InputError(f"per_panel must be at least 1, got {per_panel}")
    n_e, n_pos = len(layers), len(tokens)
    probs = top_probs.tolist()
    if color == "prob":
        z = [[probs[e][i][0] for i in range(n_pos)] for e in range(n_e)]
        axis: dict[str, Any] = {"colorscale": PROBABILITY, "cmin": 0, "cmax": 1,
                                "colorbar": {"title": {"text": "probability of<br>the top token"}}}  # fmt: skip
    else:
        codes, axis = _lang_colours(top_langs)
        z = [[codes.get(top_langs[e][i][0] or "", 0) for i in range(n_pos)] for e in range(n_e)]
    panels = [list(range(a, min(a + per_panel, n_pos))) for a in range(0, n_pos, per_panel)]
    fig = make_subplots(rows=len(panels), cols=1, vertical_spacing=min(0.3 / len(panels), 0.12))
    for r, cols in enumerate(panels, start=1):
        fig.add_trace(
            go.Heatmap(
                z=[[z[e][i] for i in cols] for e in range(n_e)],
                x=[f"{i}: {_cell_label(tokens[i], 10)}" for i in cols],
                y=list(layers),
                text=[[_cell_label(top_tokens[e][i][0]) for i in cols] for e in range(n_e)],
                texttemplate="%{text}",
                customdata=[
                    [_hover(top_tokens[e][i], probs[e][i], top_langs[e][i]) for i in cols]
                    for e in range(n_e)
                ],  # fmt: skip
                hovertemplate="layer %{y}, after %{x}<br>%{customdata}<extra></extra>",
                coloraxis="coloraxis",
                xgap=1,
                ygap=1,
            ),
            row=r,
            col=1,
        )
    what = "probability" if color == "prob" else "language"
    lang = f" ({prompt_lang} prompt)" if prompt_lang else ""
    panel_h = 22 * n_e + 110
    height = max(360, panel_h * len(panels) + 120)
    axis["colorbar"].update({"lenmode": "pixels", "len": min(300, height - 120), "y": 1,
                             "yanchor": "top"})  # fmt: skip
    fig.update_xaxes(title_text="input position: token", tickangle=-45)
    fig.update_yaxes(title_text="layer (blocks applied)", dtick=1)
    fig.update_layout(
        title=f"{decoder.capitalize()} lens{lang}: top next token per layer and position<br>"
        f"coloured by its {what} (n = {n_pos} positions x {n_e} layers)",
        coloraxis=axis,
        height=height,
        width=min(MAX_GRID_WIDTH, 80 * min(n_pos, per_panel) + 260),
    )
    return fig

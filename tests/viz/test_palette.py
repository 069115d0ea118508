"""One colour per concept: every figure of :mod:`mechlingo.viz` that draws trace classes,
languages, decoders or conditions takes the colour of each from :mod:`mechlingo.viz.palette`,
so a concept has one colour across figures (the trace report once drew "recall failure" red
in one class figure and orange in the next)."""

from __future__ import annotations

import ast
import zlib
from collections import defaultdict
from typing import Any

import pandas as pd
import pytest
import torch

from mechlingo.analyses.recall.trace import CLASSES
from mechlingo.viz import palette
from mechlingo.viz.align import pca_figure, retrieval_per_layer_figure
from mechlingo.viz.evaluate import accuracy_bars
from mechlingo.viz.experts import experts_per_layer_figure, interval_bars_figure, k_curve_figure
from mechlingo.viz.lens import (
    DecoderPanel,
    decoder_curves_figure,
    latent_curves_figure,
    lens_kl_figure,
)
from mechlingo.viz.steer import accuracy_ci_figure, headroom_figure
from mechlingo.viz.trace import class_fractions_figure, class_profiles_figure

LANGS = ["en", "fr", "de"]
CELL = {"estimate": 0.5, "lo": 0.4, "hi": 0.6}


def _colour(trace: Any) -> str | None:
    """A trace's drawn colour: its marker colour (bars, scatter markers) or line colour."""
    marker = getattr(trace, "marker", None)
    if marker is not None and isinstance(marker.color, str):
        return marker.color
    line = getattr(trace, "line", None)
    return line.color if line is not None else None


def _figures() -> dict[str, list[tuple[str, str, Any]]]:
    """``{figure name: [(concept, name, figure), ...]}``: each figure with the concept its
    traces are named by, and a function from a trace to that concept's name (None: skip)."""
    counts = {lg: {c: i + 1 for i, c in enumerate(CLASSES)} for lg in LANGS}
    ranks = torch.randint(0, 50, (4, 6))
    curves = pd.DataFrame(
        [{"lang": lg, "track": t, "layer": k, "mean": 0.3, "std": 0.1}
         for lg in LANGS for t in ("answer", "en", "fr") for k in range(3)]
    )  # fmt: skip
    panel = DecoderPanel(
        layers=[0, 1, 2],
        logprob={"answer": torch.rand(3, 4).log(), "en": torch.rand(3, 4).log()},
        rank={"answer": torch.randint(0, 9, (3, 4)), "en": torch.randint(0, 9, (3, 4))},
        entropy=torch.rand(3, 4),
        energy=torch.rand(3, 4),
    )
    kl = {"kl": [1.0, 0.5], "lo": [0.9, 0.4], "hi": [1.1, 0.6]}
    k_rows = [
        {"k": k, "arm": arm, "target_rate_bos": 0.2, "target_rate_prompt": 0.3,
         "ppl_en": 10.0, "ppl_fr": 12.0, "ppl_ratio_fr": 1.2}
        for k in (1, 10) for arm in ("experts", "random")
    ] + [{"k": 0, "arm": "none", "target_rate_bos": 0.1, "target_rate_prompt": 0.1,
          "ppl_en": 10.0, "ppl_fr": 12.0, "ppl_ratio_fr": 1.0}]  # fmt: skip
    per_lang = {c: dict.fromkeys(LANGS, 0.5) for c in ("orig", "task", "diff", "both", "random")}
    return {
        "class fractions": [("class", class_fractions_figure(counts))],
        "class bars": [
            ("class", accuracy_bars({c: dict.fromkeys(LANGS, 0.2) for c in CLASSES}, "classes"))
        ],  # fmt: skip
        "profiles": [
            (
                "track",
                class_profiles_figure(
                    ranks,
                    ranks,
                    classes=["correct", "recall_failure"] * 3,
                    prompt_langs=["fr", "de", "fr"] * 2,
                    layers=[0, 1, 2, 3],
                    langs=["fr", "de"],
                    max_rank=10,
                ),
            )
        ],  # fmt: skip
        "latent curves": [("track", latent_curves_figure(curves))],
        "decoder curves": [
            (
                "track",
                decoder_curves_figure({"logit": panel, "tuned": panel}, langs=["fr"], n_prompts=4),
            )
        ],  # fmt: skip
        "lens kl": [
            (
                "decoder",
                lens_kl_figure(
                    {
                        "entries": [0, 1],
                        "n_texts": 3,
                        "n_tokens": 9,
                        "decoders": {"logit lens": kl, "tuned_lens": kl, "patchscope": kl},
                    }
                ),
            )
        ],  # fmt: skip
        "accuracy bars": [("condition", accuracy_bars(per_lang, "steering"))],
        "accuracy ci": [
            (
                "condition",
                accuracy_ci_figure(
                    {c: dict.fromkeys(LANGS, CELL) for c in ("orig", "task", "random")}
                ),
            )
        ],  # fmt: skip
        "headroom": [
            (
                "condition",
                headroom_figure(
                    {
                        "k": 2,
                        "zero_shot": dict.fromkeys(LANGS, CELL),
                        "k_shot": dict.fromkeys(LANGS, CELL),
                    }
                ),
            )
        ],  # fmt: skip
        "interval bars": [
            (
                "condition",
                interval_bars_figure(
                    {
                        "m": {
                            a: {"estimate": 0.5, "lo": 0.4, "hi": 0.6}
                            for a in ("pre", "post", "control")
                        }
                    },
                    "arms",
                ),
            )
        ],  # fmt: skip
        "retrieval per layer": [
            ("condition", retrieval_per_layer_figure({"pre": {"0": 0.2}, "post": {"0": 0.4}}))
        ],  # fmt: skip
        "experts per layer": [
            (
                "language",
                experts_per_layer_figure(torch.ones(3, 2, dtype=torch.long), LANGS, [0, 1], 5),
            )
        ],  # fmt: skip
        "pca": [("language", pca_figure(torch.rand(3, 4, 2), torch.rand(3, 4, 2), LANGS, 1))],
        "k curve": [("k curve", k_curve_figure(k_rows, "fr"))],
    }


_ANSWER_NAMES = {"prompt-language answer": "answer", "answer (prompt language)": "answer",
                 "English answer": "en"}  # fmt: skip
_CLASS_NAMES = {c.replace("_", " "): c for c in CLASSES}


def _concept_of(kind: str, trace: Any) -> tuple[str, str] | None:
    """``(concept, name)`` a trace stands for, from its legend name (None: not a series)."""
    name = trace.name
    if name is None:
        return None
    if kind == "class":
        return ("class", _CLASS_NAMES.get(name, name))
    if kind == "track":
        if name in _ANSWER_NAMES:
            return ("track", _ANSWER_NAMES[name])
        if name.startswith("answer in "):
            return ("track", name.removeprefix("answer in "))
        return ("track", name) if name in ("entropy", "energy") else None
    if kind == "k curve":
        arm = name.split(",")[0].split(" ")[0]
        if "," in name:
            return ("condition", arm)
        return ("language", name.split(" ")[1])
    if kind == "condition" and name.endswith("-shot"):
        return ("condition", "zero_shot" if name == "zero-shot" else "k_shot")
    return (kind, name)


def _expected(concept: str, name: str) -> str:
    return {
        "class": palette.class_color,
        "track": palette.track_color,
        "decoder": palette.decoder_color,
        "condition": palette.condition_color,
        "language": palette.language_color,
    }[concept](name)


def test_every_figure_draws_a_concept_in_its_palette_colour():
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for figure, entries in _figures().items():
        for kind, fig in entries:
            drawn = 0
            for trace in fig.data:
                concept = _concept_of(kind, trace)
                if concept is None or trace.name in (None, "mean") or "chosen" in trace.name:
                    continue
                colour = _colour(trace)
                assert colour == _expected(*concept), (figure, trace.name, colour)
                seen[concept].add(colour)
                drawn += 1
            assert drawn >= 2, figure  # the figure drew series the test could name
    # one concept, one colour, across every figure that draws it
    assert {k: v for k, v in seen.items() if len(v) != 1} == {}
    # the concepts the issue names are all drawn by two figures or more
    assert {("class", "recall_failure"), ("track", "en"), ("condition", "random")} <= set(seen)
    assert seen[("class", "recall_failure")] == {"#d62728"}


def test_recall_failure_has_one_colour_in_both_class_figures_of_the_trace_report():
    counts = {lg: {c: 1 for c in CLASSES} for lg in LANGS}
    stacked = class_fractions_figure(counts)
    bars = accuracy_bars({c: dict.fromkeys(LANGS, 0.2) for c in CLASSES}, "classes")
    for c in CLASSES:
        a = next(t for t in stacked.data if t.name == c.replace("_", " "))
        b = next(t for t in bars.data if t.name == c.replace("_", " "))  # the same label
        assert a.marker.color == b.marker.color == palette.CLASS[c]


def test_the_concepts_names_do_not_overlap_and_series_color_finds_each():
    maps = {"class": palette.CLASS, "condition": palette.CONDITION,
            "decoder": palette.DECODER, "language": palette.LANGUAGE}  # fmt: skip
    names = [n for m in maps.values() for n in m]
    assert len(names) == len(set(names))
    for concept, m in maps.items():
        for name in m:
            assert palette.series_color(name) == _expected(concept, name), (concept, name)


@pytest.mark.parametrize(
    ("fn", "a", "b"),
    [
        (palette.decoder_color, "logit", "Logit lens"),
        (palette.decoder_color, "tuned", "tuned_lens"),
        (palette.condition_color, "random", "random_3"),
        (palette.condition_color, "k_shot", "2-shot"),
        (palette.condition_color, "zero_shot", "zero-shot"),
        (palette.class_color, "recall_failure", "recall failure"),
        (palette.language_color, "pt", "pt-BR"),
    ],
)
def test_spellings_of_one_concept_share_its_colour(fn, a, b):
    assert fn(a) == fn(b)


def test_an_unlisted_name_gets_a_colour_from_the_name_not_from_its_position():
    assert "xx" not in palette.LANGUAGE
    one = experts_per_layer_figure(torch.ones(2, 1, dtype=torch.long), ["xx", "en"], [0], 1)
    two = experts_per_layer_figure(torch.ones(2, 1, dtype=torch.long), ["en", "xx"], [0], 1)
    colour = {t.name: t.marker.color for t in one.data}
    assert colour == {t.name: t.marker.color for t in two.data}
    assert colour["xx"] in palette.SPARE and colour["en"] == palette.LANGUAGE["en"]
    assert palette.language_color("xx") == palette.SPARE[zlib.crc32(b"xx") % len(palette.SPARE)]


def _scale(name: str) -> list[list[Any]]:
    """A named colour scale as a figure's JSON holds it (plotly expands the name)."""
    import plotly.graph_objects as go

    return [list(p) for p in go.Heatmap(colorscale=name).to_plotly_json()["colorscale"]]


def _scales(fig: Any) -> list[list[list[Any]]]:
    """Every colour scale in a figure's JSON: its traces' and its shared colour axis's."""
    doc = fig.to_plotly_json()
    found = [t.get("colorscale") for t in doc["data"]] + [
        doc["layout"].get("coloraxis", {}).get("colorscale")]  # fmt: skip
    return [[list(p) for p in s] for s in found if s is not None]


def test_each_heatmap_uses_its_concepts_colour_scale():
    from mechlingo.viz.align import retrieval_heatmaps
    from mechlingo.viz.circuit import language_matrix_figure
    from mechlingo.viz.experts import overlap_figure
    from mechlingo.viz.lens import lens_heatmap, token_grid_figure
    from mechlingo.viz.patching import patching_heatmaps
    from mechlingo.viz.side_effects import side_effects_heatmap
    from mechlingo.viz.steer import sweep_heatmap, transfer_heatmap

    names = ("PROBABILITY", "SCORE", "OVERLAP", "RANK", "SIGNED_EFFECT", "CHANGE")
    concepts = {c: _scale(getattr(palette, c)) for c in names}
    assert len({str(s) for s in concepts.values()}) == 6  # one scale per concept, all different
    lens = {"rank": torch.randint(0, 9, (3, 2)), "logprob": torch.rand(3, 2).log(), "layers": [0, 1, 2],
            "prompts": ["a", "b"], "langs": ["en", "fr"], "answers": ["x", "y"],
            "top_tokens": [[["t"], ["u"]]] * 3}  # fmt: skip
    grid = ([" a", " b"], [[[" w", " v"]] * 2] * 2, torch.rand(2, 2, 2), [[["de", None]] * 2] * 2)
    sweep = [{"stage": "screen", "vector": "task", "layer": 1, "alpha": 2.0, "score": 0.4}]
    cells, ns = {"en": {"fr": 0.2}, "fr": {"en": 0.2}}, {"en": 9, "fr": 8}
    figures = {
        "lens, probability": (lens_heatmap(**lens, value="prob"), "PROBABILITY"),
        "lens, rank": (lens_heatmap(**lens, value="rank"), "RANK"),
        "token grid": (token_grid_figure(*grid, layers=[0, 1], color="prob"), "PROBABILITY"),
        "expert overlap": (overlap_figure(torch.rand(2, 2), ["en", "fr"], 5), "OVERLAP"),
        "circuit faithfulness": (language_matrix_figure(cells, ns, title="t", colorbar="c"), "SCORE"),
        "circuit Jaccard": (language_matrix_figure(cells, ns, title="t", colorbar="c",
                                                   colorscale=palette.OVERLAP), "OVERLAP"),
        "steering sweep": (sweep_heatmap(sweep, vector="task", unit="x"), "SCORE"),
        "retrieval": (retrieval_heatmaps(torch.rand(2, 2), None, ["en", "fr"], 3), "SCORE"),
        "patching": (patching_heatmaps({"resid_pre": torch.rand(2, 3) - 0.5}, layers=[0, 1],
                                       position_labels=["a", "b", "c"], heads=[],
                                       readout_name="logit_diff", alignment="last"), "SIGNED_EFFECT"),
        "transfer": (transfer_heatmap([{"row": "r", "col": "c", "n": 4, "gain": CELL}],
                                      rows=["r"], cols=["c"], by="relation"), "SIGNED_EFFECT"),
        "side effects": (side_effects_heatmap(
            [{"arm": "intervention", "lang": "en", "measure": "accuracy", "delta": -0.1,
              "ci_low": -0.2, "ci_high": 0.0, "n": 9}], ["en"], ["accuracy"]), "CHANGE"),
    }  # fmt: skip
    for name, (fig, concept) in figures.items():
        assert _scales(fig) and all(s == concepts[concept] for s in _scales(fig)), name
    # the retrieval difference panel is diverging, not the score's scale
    both = _scales(retrieval_heatmaps(torch.rand(2, 2), torch.rand(2, 2), ["en", "fr"], 3))
    assert both[:2] == [concepts["SCORE"]] * 2 and both[2] == concepts["SIGNED_EFFECT"]
    # diverging: white in the middle; a signed effect is blue up, a side effect's change red up
    effect, change = concepts["SIGNED_EFFECT"], concepts["CHANGE"]
    assert [c for _, c in effect] == [c for _, c in reversed(change)]
    top, bottom = _rgb(effect[-1][1]), _rgb(effect[0][1])
    assert top[2] > top[0] and bottom[0] > bottom[2]  # blue up, red down
    assert min(_rgb(effect[len(effect) // 2][1])) > 240  # white at the middle


def _rgb(colour: str) -> tuple[int, ...]:
    return tuple(int(v) for v in colour.removeprefix("rgb(").rstrip(")").split(","))


#: Where a figure names its colour scale: a keyword argument or a key of a layout dict.
_SCALE_KEYS = {"colorscale", "color_continuous_scale", "colorscales"}


def inline_scales(source: str) -> list[int]:
    """The lines of ``source`` that write a colour scale inline: a plotly scale's name as a
    string (``"RdBu"``, ``"Viridis_r"``), or any literal given as ``colorscale=`` (a keyword
    or a dict key) instead of a name from the palette."""
    from plotly import colors

    named: set[str] = set()
    for mod in (colors.sequential, colors.diverging, colors.cyclical):
        named |= {n for n in dir(mod) if n[:1].isupper() and isinstance(getattr(mod, n), list)}
    named |= {n + "_r" for n in named}
    tree = ast.parse(source)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in named:
            lines.append(node.lineno)
        values = []
        if isinstance(node, ast.keyword) and node.arg in _SCALE_KEYS:
            values.append(node.value)
        if isinstance(node, ast.Dict):
            values += [v for k, v in zip(node.keys, node.values, strict=True)
                       if isinstance(k, ast.Constant) and k.value in _SCALE_KEYS]  # fmt: skip
        lines += [v.lineno for v in values if isinstance(v, ast.Constant | ast.List | ast.Tuple)]
    return sorted(set(lines))


def test_no_figure_writes_a_colour_scale_inline():
    from pathlib import Path

    pkg = Path(palette.__file__).resolve().parents[1]
    found = {}
    for path in sorted(pkg.rglob("*.py")):
        if path.name != "palette.py" and (lines := inline_scales(path.read_text("utf-8"))):
            found[str(path.relative_to(pkg))] = lines
    assert not found, f"name the scale in mechlingo.viz.palette and use it: {found}"


def test_the_inline_scale_check_finds_each_kind():
    planted = (
        "a = ('after', x, 'RdBu')\n"
        "go.Heatmap(z=z, colorscale='rdbu')\n"
        "fig.update_layout(coloraxis={'colorscale': [[0, 'red'], [1, 'blue']]})\n"
        "go.Heatmap(z=z, colorscale=SCORE)\n"
        "row = {'delta': 1, 'measure': 'accuracy'}\n"
    )
    assert inline_scales(planted) == [1, 2, 3]

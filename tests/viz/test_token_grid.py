"""The token-lens grid at any prompt length, read from the figure's JSON: wrapped panels, a
bounded width, one colour bar beside them, every token in full in the hover, languages named
as the page names them."""

from __future__ import annotations

import torch

from mechlingo.viz.lens import MAX_GRID_WIDTH, POSITIONS_PER_PANEL, token_grid_figure


def _grid(n_pos: int, n_e: int = 4, k: int = 2):
    tokens = [f" tok{i}" for i in range(n_pos)]
    tokens[3] = " <b>antidisestablishment</b>"
    top = [[[f" w{e}{i}", " Paris"] for i in range(n_pos)] for e in range(n_e)]
    top[1][3][0] = " Hauptstadtbibliothek"
    probs = torch.linspace(0.05, 0.95, n_e * n_pos * k).reshape(n_e, n_pos, k)
    langs = [[["de" if (e + i) % 3 == 0 else None, "shared"] for i in range(n_pos)]
             for e in range(n_e)]  # fmt: skip
    return tokens, top, probs, langs, list(range(n_e))


def test_a_35_token_prompt_wraps_into_panels_of_bounded_width():
    tokens, top, probs, langs, layers = _grid(35)
    doc = token_grid_figure(tokens, top, probs, langs, layers=layers).to_plotly_json()
    heat = doc["data"]
    assert len(heat) == 3  # 12 + 12 + 11 positions
    xs = [x for tr in heat for x in tr["x"]]
    assert [int(x.split(":")[0]) for x in xs] == list(range(35))  # each position once, in order
    assert all(len(tr["x"]) <= POSITIONS_PER_PANEL for tr in heat)
    assert doc["layout"]["width"] <= MAX_GRID_WIDTH  # was 70 * 35 + 220 = 2,670 pixels
    # one colour bar for every panel, at the top right, of a fixed length
    assert all(tr["coloraxis"] == "coloraxis" for tr in heat)
    bar = doc["layout"]["coloraxis"]["colorbar"]
    assert bar["lenmode"] == "pixels" and bar["len"] <= 300 and bar["y"] == 1
    # the cells are the probabilities, panel by panel
    z = [row for tr in heat for row in zip(*tr["z"], strict=True)]  # per position
    assert torch.allclose(torch.tensor(z).T, probs[:, :, 0])


def test_cells_are_cut_and_the_hover_has_every_token_in_full_escaped():
    tokens, top, probs, langs, layers = _grid(6)
    doc = token_grid_figure(tokens, top, probs, langs, layers=layers).to_plotly_json()
    (tr,) = doc["data"]
    assert tr["text"][1][3] == "·Haupts…" and len(tr["text"][1][3]) == 8
    assert "' Hauptstadtbibliothek'" in tr["customdata"][1][3]
    assert tr["x"][3] == "3: ·&lt;b&gt;antid…"  # 10 characters, escaped: not bold
    hover = tr["customdata"][0][0]
    p = probs[0, 0].tolist()
    assert hover == f"' w00' {p[0]:.3f} (de)<br>' Paris' {p[1]:.3f} (shared)"
    assert tr["customdata"][0][1].startswith(f"' w01' {probs[0, 1, 0]:.3f} (none)")  # not "?"


def test_the_language_colours_name_none_and_shared_as_the_hover_does():
    tokens, top, probs, langs, layers = _grid(5)
    fig = token_grid_figure(tokens, top, probs, langs, layers=layers, color="lang",
                            prompt_lang="fr")  # fmt: skip
    doc = fig.to_plotly_json()
    bar = doc["layout"]["coloraxis"]["colorbar"]
    assert bar["ticktext"] == ["none", "shared", "de"] and bar["tickvals"] == [0, 1, 2]
    z = doc["data"][0]["z"]
    assert z[0][0] == 2 and z[0][1] == 0  # de, none
    assert doc["layout"]["title"]["text"].startswith("Logit lens (fr prompt)")

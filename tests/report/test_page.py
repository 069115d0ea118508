"""Report pages: an anchor on every section, plotly.js inlined by default or shared from
one file beside the reports."""

from __future__ import annotations

import re

import pytest

from mechlingo.report.page import PLOTLYJS_FILE, Report, write_outputs


def _report(**kw) -> Report:
    rep = Report("t", {"model": "m"}, **kw)
    rep.add_heading("Classes per language")
    rep.add_heading("Classes per language")  # the same title twice
    rep.add_heading("Circuit (fr)")
    rep.add_heading("Prompt 1 (ja): 日本の首都は")
    return rep


def test_every_section_has_its_own_anchor():
    page = _report().render()
    ids = re.findall(r"<h2 id='([^']+)'><a href='#([^']+)'", page)
    assert [a for a, _ in ids] == ["classes-per-language", "classes-per-language-2",
                                   "circuit-fr", "prompt-1-ja-日本の首都は"]  # fmt: skip
    assert all(a == b for a, b in ids)
    assert Report("t").add_heading("x", anchor="fig-x") == "fig-x"


def test_plotly_is_inlined_by_default_and_shared_from_one_file_on_request(tmp_path, monkeypatch):
    monkeypatch.delenv("MECHLINGO_PLOTLYJS", raising=False)
    inline = _report().render()
    assert len(inline) > 1_000_000 and PLOTLYJS_FILE not in inline and _report().assets() == {}
    shared = _report(plotlyjs="file")
    page = shared.render()
    assert len(page) < 20_000 and f"src='{PLOTLYJS_FILE}'" in page
    write_outputs(tmp_path / "out", {"a.html": shared, "b.html": _report(plotlyjs="file")})
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["a.html", "b.html", PLOTLYJS_FILE]  # one plotly.js for both
    assert (tmp_path / "out" / PLOTLYJS_FILE).read_text() == shared.assets()[PLOTLYJS_FILE]
    monkeypatch.setenv("MECHLINGO_PLOTLYJS", "file")
    assert Report("t").plotlyjs == "file" and Report("t", plotlyjs="inline").plotlyjs == "inline"
    monkeypatch.setenv("MECHLINGO_PLOTLYJS", "cdn")
    with pytest.raises(ValueError, match="use inline or file"):
        Report("t")


def test_use_plotlyjs_sets_the_mode_of_reports_made_inside(monkeypatch):
    from mechlingo.report.page import use_plotlyjs

    monkeypatch.setenv("MECHLINGO_PLOTLYJS", "file")
    with use_plotlyjs("inline"):  # the flag wins over the environment
        assert Report("t").plotlyjs == "inline"
        assert Report("t", plotlyjs="file").plotlyjs == "file"  # a report's own mode wins
    assert Report("t").plotlyjs == "file"
    with use_plotlyjs(None):  # no flag: the environment, then inline
        assert Report("t").plotlyjs == "file"
    with pytest.raises(ValueError, match="use inline or file"), use_plotlyjs("cdn"):
        pass

"""The package as a user installs it: the built wheel's contents and metadata, the wheel
installed into a fresh virtual environment outside the checkout, and the command line's
``--version`` and ``--help`` defaults.

How the fresh environment is made (``scripts/release.py``'s ``fresh_venv``, which ``make
release`` uses too), honestly: to stay fast and offline, the test does not
download torch, transformers and the other dependencies again. It creates a venv without
pip, installs the wheel into it with ``--no-deps --no-index`` (the dev environment's pip
acting on it through ``pip --python``), and gives it the dev environment's site-packages as
a *plain* path in a ``.pth`` file, after its own site-packages. So the dependencies come from
the dev environment, while ``mechlingo`` itself comes only from the installed wheel (the
dev environment's editable install is not activated: a plain path in a ``.pth`` does not run
that directory's own ``.pth`` hooks); the test checks that the imported package lies in the
fresh venv and not in the checkout. What this does not check is dependency resolution
(``pip install`` picking versions from the index); ``pyproject.toml`` states the ranges.
"""

from __future__ import annotations

import argparse
import email
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import mechlingo
from mechlingo.cli.main import build_parser
from mechlingo.core.version import __version__
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=300, env=_clean_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("mechlingo-*.whl")
    return path


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    """The wheel in a fresh venv, made as ``make release`` makes one (``scripts/release.py``)."""
    return load_script("release").fresh_venv(wheel, tmp_path_factory.mktemp("fresh") / "venv")


def test_wheel_contents_and_metadata(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = email.message_from_bytes(zf.read(f"mechlingo-{__version__}.dist-info/METADATA"))
    assert wheel.name == f"mechlingo-{__version__}-py3-none-any.whl"
    assert {"mechlingo/py.typed", "mechlingo/data/facts.jsonl", "mechlingo/cli/main.py"} <= names
    assert f"mechlingo-{__version__}.dist-info/licenses/LICENSE" in names
    assert not any(n.startswith(("tests/", "notebooks/", "scripts/")) for n in names)
    assert meta["License-Expression"] == "MIT"
    assert meta["Version"] == __version__
    assert meta["Requires-Python"] == "<3.14,>=3.11"
    requires = meta.get_all("Requires-Dist")
    for name in ("torch", "transformer-lens", "huggingface_hub", "tokenizers", "jaxtyping"):
        assert any(r.startswith(name) for r in requires), name
    assert not any(r.startswith("babel") and "extra" not in r for r in requires)
    extras = set(meta.get_all("Provides-Extra"))
    assert {"test", "notebook", "data-gen"} <= extras
    assert "Programming Language :: Python :: 3.13" in meta.get_all("Classifier")


def test_fresh_venv_runs_version(fresh_venv, tmp_path):
    bin_dir = fresh_venv / "bin"
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import mechlingo; print(mechlingo.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(fresh_venv), where
    assert not Path(where).is_relative_to(ROOT)
    proc = subprocess.run(
        [str(bin_dir / "mechlingo"), "--version"],
        capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"mechlingo {__version__}"


def test_pip_install_from_the_checkout(tmp_path):
    """``pip install /path/to/checkout`` (not editable) in another fresh venv, the same way."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # first: the build backend (setuptools) too comes from the dev environment
    (Path(site) / "zz_dev_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
         "--no-build-isolation", "--no-index", str(ROOT)],
        capture_output=True, text=True, timeout=300, env=_clean_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = subprocess.run(
        [str(venv / "bin" / "mechlingo"), "--version"],
        capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=300,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == f"mechlingo {__version__}", out.stderr
    assert (Path(site) / "mechlingo" / "py.typed").is_file()


@pytest.mark.slow
def test_fresh_venv_runs_a_command_on_the_embedded_model(fresh_venv, tmp_path):
    import json

    out = tmp_path / "lens"
    proc = subprocess.run(
        [str(fresh_venv / "bin" / "mechlingo"), "lens", "--langs", "en,fr", "--relation",
         "capital", "--limit", "2", "--quiet", "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["format_version"] == 1
    assert summary["meta"]["mechlingo"] == __version__
    assert (out / "report.html").stat().st_size > 10_000


def _all_parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_help_shows_every_default():
    missing = []
    parsers = list(_all_parsers(build_parser()))
    assert len(parsers) > 8
    for parser in parsers:
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if not action.option_strings or action.default in (None, argparse.SUPPRESS):
                continue
            if isinstance(action.default, bool):
                continue
            if not action.help:
                missing.append(f"{parser.prog} {action.option_strings[0]}: no help")
            elif "default" not in action.help.lower() and str(action.default) not in text:
                missing.append(f"{parser.prog} {action.option_strings[0]}")
    assert not missing, missing


def test_help_formatter_appends_the_default():
    from mechlingo.cli.flags import HelpParser

    p = HelpParser(prog="x")
    p.add_argument("--k", type=int, default=7, help="how many")
    p.add_argument("--said", default=3, help="n (default 3)")
    p.add_argument("--flag", action="store_true", help="a switch")
    text = " ".join(p.format_help().split())
    assert "how many (default: 7)" in text
    assert "n (default 3)" in text and "(default: 3)" not in text
    assert "a switch (default" not in text


def test_version_flag_and_module_agree():
    proc = subprocess.run(
        [sys.executable, "-m", "mechlingo.cli", "--version"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == f"mechlingo {__version__}"
    assert mechlingo.__version__ == __version__


def test_licence_and_citation_files():
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "WITHOUT WARRANTY" in licence
    cff = (ROOT / "CITATION.cff").read_text()
    assert "cff-version: 1.2.0" in cff and f"version: {__version__}" in cff
    for arxiv in ("2505.20546", "2502.15639"):
        assert arxiv in cff


@pytest.mark.skipif(bool(os.environ.get("MECHLINGO_NO_SHAPE_CHECKS")), reason="checks off")
def test_shape_annotations_are_checked_at_run_time_in_the_tests():
    """conftest.py's import hook: a tensor that does not match its jaxtyping annotation
    fails the call, after the function had its chance to refuse it with its own error."""
    from types import SimpleNamespace

    import torch

    from mechlingo.kernels.ranking import auroc
    from mechlingo.kernels.readout import output_transform

    model = SimpleNamespace(cfg=SimpleNamespace(output_logits_soft_cap=-1.0))
    assert output_transform(model, torch.zeros(2, 5)).shape == (2, 5)
    with pytest.raises(TypeError, match="output_transform"):
        output_transform(model, torch.zeros(2, 5, dtype=torch.long))  # not Float
    with pytest.raises(Exception) as err:  # the kernel's own message, not the shape check's
        auroc(torch.rand(6, 3), torch.tensor([True, False, True, False, True]))
    assert not isinstance(err.value, TypeError), err.value


@pytest.mark.skipif(bool(os.environ.get("MECHLINGO_NO_SHAPE_CHECKS")), reason="checks off")
def test_only_functions_with_array_annotations_are_wrapped():
    """The hook leaves a function without array annotations as it is (nothing to check, and
    jaxtyping's wrapper made the suite slow); one with them keeps the check."""
    import jaxtyping
    import torch

    from mechlingo.data import io
    from mechlingo.kernels import readout
    from tests import shape_checks

    assert jaxtyping.jaxtyped is shape_checks._jaxtyped_where_arrays
    assert not hasattr(io.load_facts, "__wrapped__")  # no array annotation
    assert hasattr(readout.output_transform, "__wrapped__")  # Float[Tensor, ...] in and out

    def plain(x: int, y: str = "a") -> list[str]:
        return [y] * x

    def arrays(x, /):
        return int(x.shape[0])

    arrays.__annotations__ = {"x": jaxtyping.Float[torch.Tensor, " n"], "return": int}

    assert shape_checks._jaxtyped_where_arrays(plain, typechecker=None) is plain
    checked = jaxtyping.jaxtyped(arrays, typechecker=shape_checks.arrays_only)
    assert checked is not arrays and checked(torch.zeros(3)) == 3
    with pytest.raises(TypeError, match="arrays"):
        checked(torch.zeros(3, dtype=torch.long))


@pytest.mark.skipif(bool(os.environ.get("MECHLINGO_NO_SHAPE_CHECKS")), reason="checks off")
def test_the_one_wrapper_checks_what_jaxtypings_wrapper_checks():
    """:func:`tests.shape_checks.checked_function` against ``jaxtyping.jaxtyped`` with the
    same checker on the same calls: axes bound across arguments and result, one memo per
    call (nested calls bind their own), keywords and defaults, ``*args``, and a function's own
    error before the deferred shape error."""
    import jaxtyping
    import torch
    from jaxtyping import Float, Int

    from tests import shape_checks

    vector = Float[torch.Tensor, " n"]

    def same(z):
        return z

    def pair(x, y=None, *, k=1):
        if x.shape[1] == 0:
            raise ValueError("its own error")
        shape_checks.checked_function(same)(torch.zeros(7))  # another call, another memo
        return x.sum(1) if y is None else x.sum(1) + y[: x.shape[0]] * k

    def many(*xs):
        return len(xs)

    def shrinks(z):
        return z[1:]

    same.__annotations__ = {"z": vector, "return": vector}
    pair.__annotations__ = {"x": Float[torch.Tensor, "n d"], "y": vector | None, "k": int,
                            "return": vector}  # fmt: skip
    many.__annotations__ = {"xs": Int[torch.Tensor, " m"], "return": int}
    shrinks.__annotations__ = {"z": vector, "return": vector}

    ours = shape_checks.checked_function(pair)
    theirs = shape_checks._ORIGINAL_JAXTYPED(pair, typechecker=shape_checks.arrays_only)
    calls = [
        ((torch.zeros(3, 2),), {}, None),
        ((torch.zeros(3, 2), torch.zeros(3)), {}, None),
        ((torch.zeros(3, 2),), {"y": torch.zeros(3), "k": 2}, None),
        ((torch.zeros(3, 2), torch.zeros(4)), {}, TypeError),  # n bound to 3, then 4
        ((torch.zeros(3, 2),), {"y": torch.zeros(4)}, TypeError),
        ((torch.zeros(3, 2, dtype=torch.long),), {}, TypeError),  # not Float
        ((torch.zeros(3, 0), torch.zeros(5)), {}, ValueError),  # its own error first
    ]
    for args, kwargs, error in calls:
        for fn in (ours, theirs):
            if error is None:
                assert torch.equal(fn(*args, **kwargs), pair(*args, **kwargs))
            else:
                with pytest.raises(error):
                    fn(*args, **kwargs)
    for fn in (shape_checks.checked_function(shrinks),
               shape_checks._ORIGINAL_JAXTYPED(shrinks, typechecker=shape_checks.arrays_only)):  # fmt: skip
        with pytest.raises(TypeError, match="the return value"):
            fn(torch.zeros(4))
    longs = [torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long)]
    assert shape_checks.checked_function(many)(*longs) == 2
    with pytest.raises(TypeError, match=r"xs\[1\]"):
        shape_checks.checked_function(many)(longs[0], torch.zeros(3, dtype=torch.long))
    assert jaxtyping.jaxtyped(shrinks, typechecker=shape_checks.arrays_only).__wrapped__ is shrinks


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_runtime_dependency_is_bounded_above_and_the_installed_version_fits():
    from importlib.metadata import version

    from packaging.requirements import Requirement

    for text in _pyproject()["project"]["dependencies"]:
        req = Requirement(text)
        assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), (
            f"{req.name} has no upper bound"
        )
        installed = version(req.name).split("+")[0]
        assert req.specifier.contains(installed, prereleases=True), (req.name, installed)


def test_citation_release_date_follows_the_changelog():
    import re

    head = re.search(rf"^## {re.escape(__version__)} — (.+)$",
                     (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)  # fmt: skip
    assert head, f"CHANGELOG.md has no section for {__version__}"
    cff = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    released = re.search(r"^date-released: ['\"]?([\d-]+)", cff, re.M)
    if head.group(1).strip() == "unreleased":
        assert released is None, "CITATION.cff gives a release date for an unreleased version"
    else:
        assert released and released.group(1) == head.group(1).strip()


def test_project_urls_are_addresses():
    for name, url in _pyproject()["project"].get("urls", {}).items():
        assert url.startswith("https://"), (name, url)

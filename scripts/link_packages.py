"""Give a side virtual environment the packages the main one already has, without installing
them again: every file of each distribution (its ``RECORD``) is hard-linked (copied where a
link cannot be made) into the side environment's site-packages, dist-info included, so pip
there sees them installed and does not download, unpack and byte-compile them again.

    .venv/bin/python scripts/link_packages.py SIDE_VENV "torch==2.13.0" ["transformers==5.25.0" ...]

Run it with the main environment's Python. Each requirement whose installed version
satisfies it is linked with the distributions it requires (recursively, extras aside);
a requirement the main environment does not satisfy is left for pip. It links nothing (and
exits 1) when the two environments' Python versions differ. Console scripts are not linked (their
first line names the main environment's Python); site-packages files only. A linked file is
a second name for the same bytes: pip in either environment replaces files, never edits
them, so upgrading or removing a package on one side leaves the other intact.

Used by ``scripts/check_hooked_transformer.sh`` (torch, and what else TransformerLens 3.9's
requirements share with .venv) and ``scripts/build_tunedlens_env.sh`` (torch, transformers
and the rest of what tuned-lens needs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def _closure(specs: list[str]) -> list[metadata.Distribution]:
    """The installed distributions that satisfy ``specs``, with what they require."""
    env = {**default_environment(), "extra": ""}
    out: dict[str, metadata.Distribution] = {}
    todo = [Requirement(s) for s in specs]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in out or (req.marker is not None and not req.marker.evaluate(env)):
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue
        if not req.specifier.contains(dist.version, prereleases=True):
            print(f"[link] {req}: {dist.version} here, left for pip", file=sys.stderr)
            continue
        out[name] = dist
        todo.extend(Requirement(r) for r in dist.requires or [])
    return list(out.values())


def _site_packages(venv: Path) -> Path:
    py = venv / "bin" / "python"
    code = "import sys, sysconfig; print(sys.version_info[:2]); print(sysconfig.get_paths()['purelib'])"
    version, path = subprocess.check_output([str(py), "-c", code], text=True).splitlines()
    if version != str(sys.version_info[:2]):
        raise SystemExit(f"[link] {venv} runs Python {version}, this one {sys.version_info[:2]}")
    return Path(path)


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


def _installed(site: Path) -> set[str]:
    """The projects with a dist-info folder in ``site``."""
    return {canonicalize_name(d.name.split("-")[0]) for d in site.glob("*.dist-info")}


def link(venv: Path, specs: list[str]) -> list[str]:
    """Link the distributions satisfying ``specs`` into ``venv``; their names and versions.
    A project the side environment already has (in any version) is left as it is."""
    target = _site_packages(venv)
    there = _installed(target)
    done = []
    for dist in _closure(specs):
        files = dist.files or []
        if canonicalize_name(dist.metadata["Name"]) in there or not any(
            f.name == "METADATA" and f.parent.name.endswith(".dist-info") for f in files
        ):
            continue  # installed there already, or not a wheel install (editable, egg)
        root = Path(str(dist.locate_file(""))).resolve()
        for f in files:
            src = Path(str(dist.locate_file(f))).resolve()
            if f.parts[0] == ".." or not src.is_file() or not src.is_relative_to(root):
                continue  # console scripts and other files outside site-packages
            _link(src, target / f)
        done.append(f"{dist.metadata['Name']}=={dist.version}")
    return done


if __name__ == "__main__":
    names = link(Path(sys.argv[1]), sys.argv[2:])
    print(f"[link] {len(names)} packages from {sys.prefix}: {' '.join(sorted(names))}")

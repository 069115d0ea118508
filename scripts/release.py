"""Build the release files and check them as a stranger gets them (``make release``).

1. ``uv build``: the sdist, then the wheel built from that sdist (so a file missing from the
   sdist fails the build), in an isolated environment with the build backend from the
   registry, into ``dist/``;
2. ``twine check --strict`` on both (the metadata, and that the README renders as the
   project's description), and the version in their names and metadata against the
   package's;
3. the wheel installed into a fresh virtual environment outside the checkout
   (:func:`fresh_venv`, which ``tests/system/test_packaging.py`` uses too), where ``mechlingo
   --version`` must run and ``import mechlingo`` must find the installed package.

twine runs through ``uv tool run`` (a throwaway environment in uv's cache), so nothing is
added to the development environment. Each step prints its wall time.

    python scripts/release.py [--out dist]
"""

from __future__ import annotations

import argparse
import email
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TWINE = "twine>=6,<7"


def clean_env() -> dict[str, str]:
    """This process's environment without the checkout on the import path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    return env


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), **kw)
    if proc.returncode != 0:
        sys.exit(f"release: {' '.join(cmd[:4])} ... failed:\n{proc.stdout[-2000:]}"
                 f"{proc.stderr[-3000:]}")  # fmt: skip
    return proc


def fresh_venv(wheel: Path, venv: Path) -> Path:
    """A new virtual environment at ``venv`` with ``wheel`` installed and nothing else; its
    path.

    To stay fast and offline it does not download torch, transformers and the other
    dependencies again: the venv is made without pip, the wheel is installed with
    ``--no-deps --no-index`` (this interpreter's pip acting on it through ``pip --python``),
    and this environment's site-packages is given to it as a *plain* path in a ``.pth`` file,
    after its own. So the dependencies come from this environment while ``mechlingo`` comes
    only from the wheel (an editable install here is not activated: a plain path in a
    ``.pth`` does not run that directory's own ``.pth`` hooks). Dependency resolution
    (``pip install`` picking versions from the index) is not checked.
    """
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
          "--no-index", str(wheel)], timeout=300)  # fmt: skip
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    dev = sysconfig.get_paths()["purelib"]
    (Path(site.stdout.strip()) / "zz_dev_dependencies.pth").write_text(dev + "\n")
    return venv


def _uv() -> str:
    here = Path(sys.executable).parent / "uv"
    found = str(here) if here.is_file() else shutil.which("uv")
    if found is None:
        sys.exit("release: uv not found; run `make packages` first (it installs uv)")
    return found


def build(out: Path) -> tuple[Path, Path]:
    """``uv build`` into ``out`` (emptied first): the sdist and the wheel built from it."""
    shutil.rmtree(out, ignore_errors=True)
    _run([_uv(), "build", "--quiet", "--out-dir", str(out), str(ROOT)], timeout=600)
    (sdist,) = out.glob("mechlingo-*.tar.gz")
    (wheel,) = out.glob("mechlingo-*.whl")
    return sdist, wheel


def check_metadata(sdist: Path, wheel: Path, version: str) -> None:
    """``twine check --strict`` on both files, then their names' and metadata's version."""
    _run([_uv(), "tool", "run", "--quiet", "--from", TWINE, "twine", "check", "--strict",
          str(sdist), str(wheel)], timeout=600)  # fmt: skip
    with zipfile.ZipFile(wheel) as zf:
        meta = email.message_from_bytes(zf.read(f"mechlingo-{version}.dist-info/METADATA"))
    with tarfile.open(sdist) as tf:
        member = tf.extractfile(f"mechlingo-{version}/PKG-INFO")
        if member is None:
            sys.exit(f"release: {sdist.name} has no PKG-INFO")
        pkg = email.message_from_bytes(member.read())
    for name, got in (("wheel", meta["Version"]), ("sdist", pkg["Version"])):
        if got != version:
            sys.exit(f"release: the {name} says version {got}, the package {version}")
    if wheel.name != f"mechlingo-{version}-py3-none-any.whl":
        sys.exit(f"release: unexpected wheel name {wheel.name}")


def check_install(wheel: Path, version: str) -> None:
    """The wheel in a fresh venv outside the checkout: ``mechlingo --version`` and where
    ``import mechlingo`` finds the package."""
    with tempfile.TemporaryDirectory(prefix="mechlingo-release-") as tmp:
        venv = fresh_venv(wheel, Path(tmp) / "venv")
        where = _run([str(venv / "bin" / "python"), "-c",
                      "import mechlingo; print(mechlingo.__file__)"], cwd=tmp).stdout.strip()  # fmt: skip
        if not Path(where).is_relative_to(venv):
            sys.exit(f"release: the fresh venv imports mechlingo from {where}")
        said = _run([str(venv / "bin" / "mechlingo"), "--version"], cwd=tmp, timeout=300)
        if said.stdout.strip() != f"mechlingo {version}":
            sys.exit(f"release: `mechlingo --version` said {said.stdout.strip()!r}")
        print(f"  fresh venv: {said.stdout.strip()}, imported from the venv")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "dist"), help="where the files go (default dist)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from mechlingo.core.version import __version__ as version

    start = t0 = time.perf_counter()
    sdist, wheel = build(Path(args.out))
    print(f"built {sdist.name} ({sdist.stat().st_size / 2**20:.1f} MiB) and {wheel.name} "
          f"({wheel.stat().st_size / 2**20:.1f} MiB) in {time.perf_counter() - t0:.0f} s")  # fmt: skip
    t0 = time.perf_counter()
    check_metadata(sdist, wheel, version)
    print(
        f"metadata: twine check --strict passed, version {version} ({time.perf_counter() - t0:.0f} s)"
    )
    t0 = time.perf_counter()
    check_install(wheel, version)
    print(f"installed and ran in {time.perf_counter() - t0:.0f} s; release files in {args.out} "
          f"({time.perf_counter() - start:.0f} s in all)")  # fmt: skip


if __name__ == "__main__":
    main()

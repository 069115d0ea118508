"""Build the API reference from the docstrings with pdoc, warnings as errors.

Usage: python scripts/build_docs.py [OUT]   (default site/api)
Every module of the package gets a page; any pdoc warning (a module that fails to import, a
duplicate, a broken reference it detects) fails the build.
"""

from __future__ import annotations

import pkgutil
import sys
import warnings
from pathlib import Path


def modules() -> list[str]:
    """The package and its tiers (pdoc documents each package's submodules)."""
    import mechlingo

    for name in mechlingo.__all__:  # resolve the lazily loaded top-level names for pdoc
        getattr(mechlingo, name)
    names = ["mechlingo"]
    for info in pkgutil.iter_modules(mechlingo.__path__, "mechlingo."):
        if info.name == "mechlingo.__main__":
            continue
        names.append(info.name)
    return names


def build(out: Path) -> list[str]:
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="google", show_source=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pdoc.pdoc(*modules(), output_directory=out)
    return modules()


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("site/api")
    names = build(target)
    print(f"API reference for {len(names)} modules in {target}")

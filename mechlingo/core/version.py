"""The package version (read by the top-level package and saved with artifacts)."""

import platform
from importlib.metadata import PackageNotFoundError, version

__version__ = "0.1.0"

# The layout version of every ``summary.json`` (its first key, ``format_version``): raised
# when a key a reader may rely on is renamed, moved or changes meaning; new keys keep it.
SUMMARY_FORMAT_VERSION = 1


def library_versions() -> dict[str, str]:
    """The versions of mechlingo, Python and the libraries whose code computes the numbers
    (torch, transformers, transformer-lens, numpy, scipy), as saved in every ``summary.json``
    (``meta.versions``); ``"not installed"`` for a missing one."""
    out = {"mechlingo": __version__, "python": platform.python_version()}
    for name in ("torch", "transformers", "transformer-lens", "numpy", "scipy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out

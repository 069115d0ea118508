"""The package version (read by the top-level package and saved with artifacts)."""

__version__ = "0.1.0"

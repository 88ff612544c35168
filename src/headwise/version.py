"""The package version (one place; ``headwise.__version__`` and the reports read it)."""

__version__ = "0.1.0"

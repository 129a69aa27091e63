"""The package version (one place; ``lite_push.__version__`` re-exports it)."""

__version__ = "0.1.0"

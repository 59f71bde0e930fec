"""h3gate: the qualification engine of pytest-h3, usable without pytest."""

__version__ = "0.1.0"

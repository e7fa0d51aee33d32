"""basal — a serving engine for Basal typed-decision models."""

__version__ = "0.1.0"
# The distribution's name (pyproject.toml): another project's `basal/__init__.py` lacks it (basal/ownership.py).
__distribution__ = "basal-bitwise"

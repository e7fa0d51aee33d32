"""basal — a serving engine for Basal typed-decision models."""

__version__ = "0.1.0"

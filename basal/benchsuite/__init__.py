"""`basal bench`: named benchmark suites, each with its baselines in the same run, written as JSON + markdown.

Shipped with the package so that any install can measure itself; the repository's own scripts (hardware checks,
comparisons with other systems, lab experiments) are in its top-level `bench/` and are not installed."""

"""`basal bench`: named benchmark suites, each with its baselines in the same run, written as JSON + markdown."""

"""Runs inside the TRITON_INTERPRET=1 process: install the order-fixed dot before any kernel runs."""

from bench.checks.interpreter_patches import patch_interpreter

patch_interpreter()

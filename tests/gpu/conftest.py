"""Kernel tests under the Triton interpreter live in `interpreter/` and run only in a process of their own with
TRITON_INTERPRET=1 (set before triton is imported); `test_interpreter_suite.py` starts that process."""

import os

collect_ignore = [] if os.environ.get("TRITON_INTERPRET") == "1" else ["interpreter"]

"""What every GPU kernel × shipped config costs on sm_90 (H100/H200), from an offline compile with the pinned Triton:
registers, spills, shared memory, asynchronous (pipelined) loads, tensor-core instructions. No GPU needed.

    python -m bench.lab.sm90_usage                 # compiled as a launch specialises them (what runs)
    python -m bench.lab.sm90_usage --unspecialised # every argument unaligned: the variant no launch runs

Each kernel is compiled the way the JIT compiles it at a launch (docs/gpu-path.md §8.1 b); `--unspecialised` drops
the 16-divisibility hints, which is what the offline check did before and why it saw GEMM spills. Triton caches
compiles (~/.triton/cache), so a rerun takes seconds.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--unspecialised", action="store_true", help="compile with no argument known 16-divisible")
    p.add_argument("--kernel", help="only this kernel (gemm, attention, rmsnorm, rope_kv, swiglu, letter_readout)")
    a = p.parse_args(argv)
    from bench.checks import sm90_compile as sc

    cases = list(dict.fromkeys(c for c in sc.all_cases() if a.kernel in (None, c.kernel)))  # sizes share configs
    print(f"{'kernel':<15} {'config':<34} warps stages  registers  spills B  shared KiB  async  wgmma  problems")
    failed = 0
    for case in cases:
        if a.unspecialised:
            case = replace(case, unaligned=tuple(name for name, _ in case.signature))
        u = sc.compile_case(case)
        problems = sc.problems(case, u)
        failed += bool(problems)
        print(
            f"{case.kernel:<15} {case.label:<34} {case.warps:5d} {case.stages:6d}  {u.registers:9d}  {u.stack:8d}"
            f"  {u.shared / 1024:10.0f}  {'yes' if u.async_copies else 'no':>5}  {'yes' if u.wgmma else 'no':>5}"
            f"  {'; '.join(problems)}".rstrip()
        )
    print(f"{len(cases)} cases, {failed} with problems", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

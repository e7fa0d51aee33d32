"""Run basal's Metal kernels on a Linux CPU: the source MLX generates for a `KernelCall`, compiled with g++ against a
C++ stand-in for Metal (metal_standin.h), driven over the call's grid.

1. `generated_source` asks MLX itself for the kernel's full source: under `mx.export_function` tracing MLX builds
   the kernel (signature from the inputs' dtypes and sizes, template, attributes) without a GPU, and `verbose=True`
   prints it. So what runs here is what MLX hands to the Metal compiler, not a copy.
2. `compile_kernel` strips the Metal attributes (`[[buffer(0)]]`, `[[kernel]]`, the host_name instantiation),
   adds a driver that loads the input buffers, walks the grid as `dispatchThreads` does (threadgroups of
   min(threadgroup, grid), the last one partial) and writes the output; the binary is cached per source.
3. `run` writes the call's inputs, runs the binary, and reads the output back.

What it cannot show: Apple's `exp` and its compiler's FMA contraction round differently from glibc's and g++'s, so
these are the kernels' bits on this stand-in, not on an Apple GPU. Invariance (the same bits whatever the batch)
and agreement with the portable path are what it checks; bench/checks/mac_check.py checks the same on the hardware.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from basal.backends.mlx import metal

STANDIN = Path(__file__).with_name("metal_standin.h")
ATTRIBUTES = {
    "thread_position_in_grid": "uint3{origin + i, 0, 0}",
    "threadgroup_position_in_grid": "uint3{group, 0, 0}",
    "thread_index_in_threadgroup": "(uint)i",
    "simdgroup_index_in_threadgroup": "(uint)(i / 32)",
    "thread_index_in_simdgroup": "(uint)(i % 32)",
    "threads_per_simdgroup": "32u",
}
C_TYPES = {"float": np.float32, "int32_t": np.int32, "int": np.int32, "uint32_t": np.uint32}


def _capture_stdout_fd(fn) -> str:
    """Run fn with file descriptor 1 sent to a temp file (MLX prints with std::cout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 1)
        try:
            fn()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        return f.read().decode()


def generated_source(call: metal.KernelCall, body: str | None = None) -> str:
    """The full Metal source MLX generates for this call (signature, template, body, instantiation); `body`
    replaces the kernel file's (for the tests' reference and negative-control kernels)."""
    if body is None:
        kernel = metal._kernel(call.name, call.input_names)
    else:
        kernel = mx.fast.metal_kernel(
            name=f"variant_{hashlib.sha256(body.encode()).hexdigest()[:8]}",
            input_names=list(call.input_names),
            output_names=["out"],
            source=body,
        )

    def traced(*inputs):
        return kernel(**{**call.kwargs(verbose=True), "inputs": list(inputs)})

    with tempfile.TemporaryDirectory() as tmp:
        text = _capture_stdout_fd(lambda: mx.export_function(str(Path(tmp) / "k.mlxfn"), traced, *call.inputs))
    match = re.search(r"```\n(.*?)```", text, re.S)
    if not match:
        raise RuntimeError(f"MLX printed no generated source for {call.name}: {text[:500]!r}")
    return match.group(1)


@dataclass(frozen=True)
class Param:
    kind: str  # "in" | "out" | "attr"
    ctype: str
    name: str
    address_space: str = ""


def parse_signature(source: str) -> tuple[str, str, list[Param], str]:
    """(function name, template arguments, parameters, body) of MLX's generated kernel."""
    head, body = source.split(") {\n", 1)
    name = re.search(r"\[\[kernel\]\] void (\w+)\(", head).group(1)
    inst = re.search(r"decltype\(\w+(<[^>]*>)\)", source)
    params = []
    for line in head.split("(\n", 1)[1].splitlines():
        line = line.strip().rstrip(",")
        if m := re.match(r"const (device|constant) (\w+)[*&] (\w+) \[\[buffer\(\d+\)\]\]", line):
            params.append(Param("in", m.group(2), m.group(3), m.group(1)))
        elif m := re.match(r"device (\w+)\* (\w+) \[\[buffer\(\d+\)\]\]", line):
            params.append(Param("out", m.group(1), m.group(2), "device"))
        elif m := re.match(r"(uint3?) (\w+) \[\[(\w+)\]\]", line):
            if m.group(2) not in ATTRIBUTES:
                raise ValueError(f"the stand-in does not provide the attribute {m.group(2)}")
            params.append(Param("attr", m.group(1), m.group(2)))
        else:
            raise ValueError(f"unexpected kernel parameter line {line!r}")
    body = body.rsplit("\n}\n", 1)[0]
    return name, inst.group(1) if inst else "", params, body


def translate(source: str) -> str:
    """MLX's generated kernel as C++ for the stand-in, plus a driver `main`."""
    name, template, params, body = parse_signature(source)
    template_decl = re.match(r"(template <[^>]*>)\n", source)
    signature = ",\n".join(
        f"  const {p.ctype}* {p.name}"
        if p.kind == "in"
        else f"  {p.ctype}* {p.name}"
        if p.kind == "out"
        else f"  {p.ctype} {p.name}"
        for p in params
    )
    kernel = f"{template_decl.group(1) if template_decl else ''}\nvoid {name}(\n{signature}) {{\n{body}\n}}\n"
    buffers = [p for p in params if p.kind != "attr"]
    driver = _driver(params, name + template, buffers)
    return f'#include "{STANDIN}"\n{kernel}\n{driver}'


def _driver(params: list[Param], call_name: str, buffers: list[Param]) -> str:
    loads = "\n".join(f"  auto {p.name}_buf = load(argv[{i + 3}]);" for i, p in enumerate(buffers))
    args = ", ".join(f"({p.ctype}*){p.name}_buf.data()" if p.kind != "attr" else ATTRIBUTES[p.name] for p in params)
    stores = "\n".join(f"  save(argv[{buffers.index(p) + 3}], {p.name}_buf);" for p in buffers if p.kind == "out")
    return f"""
static std::vector<char> load(const char* path) {{
  FILE* f = std::fopen(path, "rb");
  if (!f) standin::fail("cannot open a buffer file");
  std::fseek(f, 0, SEEK_END);
  long n = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  std::vector<char> data(n);
  if (n && std::fread(data.data(), 1, n, f) != (size_t)n) standin::fail("short read");
  std::fclose(f);
  return data;
}}
static void save(const char* path, const std::vector<char>& data) {{
  FILE* f = std::fopen(path, "wb");
  std::fwrite(data.data(), 1, data.size(), f);
  std::fclose(f);
}}
int main(int argc, char** argv) {{
  // argv: grid_x threadgroup_x, then one file per buffer in signature order (outputs pre-sized, overwritten)
  if (argc != {len(buffers) + 3}) standin::fail("wrong argument count");
  uint grid = (uint)std::atol(argv[1]);
  uint tg = std::min<uint>((uint)std::atol(argv[2]), grid);  // MLX: group = min(threadgroup, grid)
{loads}
  for (uint group = 0; group * tg < grid; ++group) {{
    uint origin = group * tg;
    uint threads = std::min<uint>(tg, grid - origin);  // dispatchThreads: the last threadgroup may be partial
    standin::run_threadgroup((int)threads, [&](int index) {{
      uint i = (uint)index;
      {call_name}({args});
    }});
  }}
{stores}
  return 0;
}}
"""


_BUILT: dict[str, Path] = {}


def compile_kernel(source: str, build_dir: Path) -> Path:
    """g++ the translated kernel once per distinct source (per test session: `build_dir` is session-scoped)."""
    cpp = translate(source)
    key = hashlib.sha256((cpp + STANDIN.read_text()).encode()).hexdigest()[:16]
    if key in _BUILT and _BUILT[key].exists():
        return _BUILT[key]
    src, exe = build_dir / f"k_{key}.cpp", build_dir / f"k_{key}"
    src.write_text(cpp)
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) on this machine")
    proc = subprocess.run(
        [cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-w", "-o", str(exe), str(src)],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(f"the stand-in build failed:\n{proc.stderr[-4000:]}")
    _BUILT[key] = exe
    return exe


def run(call: metal.KernelCall, build_dir: Path, body: str | None = None) -> np.ndarray:
    """The call's output, computed by MLX's generated source for it on this CPU."""
    if call.launch.grid[1:] != (1, 1) or call.launch.threadgroup[1:] != (1, 1):
        raise ValueError("the stand-in runs one-dimensional grids only")
    source = generated_source(call, body)
    exe = compile_kernel(source, build_dir)
    _, _, params, _ = parse_signature(source)
    buffers = [p for p in params if p.kind != "attr"]
    with tempfile.TemporaryDirectory(dir=build_dir) as tmp:
        files = []
        for p, array in zip([p for p in buffers if p.kind == "in"], call.inputs, strict=True):
            data = np.ascontiguousarray(np.array(array), dtype=C_TYPES[p.ctype])
            files.append(Path(tmp) / f"{p.name}.bin")
            data.tofile(files[-1])
        out = Path(tmp) / "out.bin"
        np.zeros(call.launch.output_shape, dtype=np.float32).tofile(out)
        files.append(out)
        proc = subprocess.run(
            [str(exe), str(call.launch.grid[0]), str(call.launch.threadgroup[0]), *map(str, files)],
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise RuntimeError(f"the emulated {call.name} kernel failed: {proc.stderr.strip()}")
        return np.fromfile(out, dtype=np.float32).reshape(call.launch.output_shape)

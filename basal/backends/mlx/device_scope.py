"""Every MLX op of a backend on that backend's device, whatever the thread's default is.

MLX gives an op the calling thread's default stream when the op is made. A backend that set the process default
(`mx.set_default_device`) would move every other model in the process onto its device: a server holding a Metal
model and an MLX-CPU model would compute one of them on the other's device. So a backend never touches the
default. It makes its arrays inside `mx.stream(device)` and runs each step of a pass inside it (`on_device`).
A `with` around a generator's body would not do: it stays entered while the generator is paused, so the engine's
thread would run on the backend's device between steps, and a second pass would exit the first one's context.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

import mlx.core as mx

from basal.core.packing.passes import advance

T = TypeVar("T")
Scope = mx.Device | mx.Stream


def on_device(scope: Scope, steps: Generator[None, None, T]) -> Generator[None, None, T]:
    """`steps`, each step run inside `mx.stream(scope)` and none of its pauses."""
    try:
        while True:
            with mx.stream(scope):
                ended, value = advance(steps)
            if ended:
                return value
            yield
    finally:
        with mx.stream(scope):
            steps.close()  # a pass stopped at a pause ends on its own device too

"""The host stays at most LAYERS_AHEAD layers ahead of the GPU on an eager pass, so a main-lane batch that arrives
during a long pass waits behind at most that many layers in the stream (pacing.py). Pure Python: a fake stream
whose events complete in order, one layer per checkpoint the driver sees."""

from __future__ import annotations

from basal.backends.cuda.gpu import pacing


class FakeStream:
    def __init__(self):
        self.queued = self.finished = 0

    def event(self):
        return FakeEvent(self)

    def depth(self) -> int:
        return self.queued - self.finished


class FakeEvent:
    def __init__(self, stream: FakeStream):
        self.stream, self.after = stream, None

    def record(self) -> None:
        self.after = self.stream.queued  # every layer queued so far

    def query(self) -> bool:
        return self.stream.finished >= self.after


def forward(stream: FakeStream, layers: int):
    for _ in range(layers):
        stream.queued += 1  # one layer's kernels launched
        yield
    return "logits"


def drive(steps, stream: FakeStream, every: int = 3) -> tuple[str, list[int]]:
    """Like the engine: resume at every checkpoint; the device finishes a layer every `every` checkpoints (slower
    than the host, as on a long pass; 0: never)."""
    depths = []
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, depths
        depths.append(stream.depth())
        if every and len(depths) % every == 0:
            stream.finished = min(stream.queued, stream.finished + 1)


def test_a_paced_pass_never_has_more_than_two_layers_queued_at_a_checkpoint(monkeypatch):
    monkeypatch.setattr(pacing, "POLL_S", 0.0)
    stream = FakeStream()
    result, depths = drive(pacing.paced(forward(stream, 32), stream.event), stream)
    assert result == "logits"
    assert max(depths) == pacing.LAYERS_AHEAD == 2
    assert stream.queued == 32


def test_a_slow_device_gets_checkpoints_not_a_blocked_thread(monkeypatch):
    """While the device is behind, the pass yields (another lane may go) instead of blocking in a synchronize."""
    monkeypatch.setattr(pacing, "POLL_S", 0.0)
    stream = FakeStream()
    steps = pacing.paced(forward(stream, 8), stream.event)
    depths = []
    for _ in range(20):  # the device finishes nothing for 20 checkpoints
        next(steps)
        depths.append(stream.depth())
    assert stream.queued == 2 and max(depths) == 2  # stopped queueing: waiting for the first layer
    result, _ = drive(steps, stream)
    assert result == "logits"


def test_negative_control_an_unpaced_pass_queues_every_layer():
    stream = FakeStream()
    _, depths = drive(forward(stream, 32), stream, every=0)
    assert max(depths) == 32


def test_until_done_yields_until_the_event_completes(monkeypatch):
    monkeypatch.setattr(pacing, "POLL_S", 0.0)
    stream = FakeStream()
    stream.queued = 3
    event = stream.event()
    event.record()
    steps = pacing.until_done(event)
    yields = 0
    for _ in steps:
        yields += 1
        stream.finished += 1
    assert yields == 3

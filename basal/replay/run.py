"""Running captured requests under one configuration: a model directory, the demo model, a `basal serve` YAML file,
or a running server's URL — through the batch path (lines of one state together, one tree), as `basal run-batch`
runs them.

A captured line names the model it was sent to; a replay asks each configuration's default model instead (the
point is to compare two configurations on the same requests), so the body's `model` is dropped.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec

from basal.batch.lines import BadLine, InputFile, Line, LineAt
from basal.batch.runner import Decide, in_group_order, run_lines
from basal.replay.diff import Outcome

MAX_LINE_BYTES = 64 << 20


class Captured:
    """The requests of a capture file, indexed (`InputFile`): the lines to run, by where they are in the file (read
    again a chunk at a time when they run), the unreadable ones, and each line's state as captured (for the worst
    examples, read from the file when asked). Open until `close`."""

    def __init__(self, path: Path):
        try:
            self.source = InputFile(path, MAX_LINE_BYTES, group=_state_group)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from e
        self.lines = [line for line in self.source.lines if isinstance(line, LineAt)]
        self.unreadable = [line for line in self.source.lines if isinstance(line, BadLine)]
        self.states = _States(self)

    def each(self) -> Iterator[Line]:
        """The lines to run in the order they are sent (by state), each body without its `model`."""
        for line in self.source.each(in_group_order(self.lines)):
            assert isinstance(line, Line)  # read again as it was when indexed
            yield Line(line.number, line.custom_id, _without_model(line.body), line.group)

    def close(self) -> None:
        self.source.close()


class _States(Mapping[str, str]):
    """custom_id -> the state text as captured, or its hash where the capture stored one: read from the file on
    the first look (a digest of each id kept, not the states)."""

    def __init__(self, captured: Captured):
        self._captured = captured
        self._at: dict[bytes, LineAt] | None = None

    def _index(self) -> dict[bytes, LineAt]:
        if self._at is None:
            lines = self._captured.lines
            self._at = {
                _digest(line.custom_id): at for at, line in zip(lines, self._captured.source.each(lines), strict=True)
            }
        return self._at

    def __getitem__(self, custom_id: str) -> str:
        at = self._index().get(_digest(custom_id))
        if at is None:
            raise KeyError(custom_id)
        (line,) = self._captured.source.read([at])
        assert isinstance(line, Line)
        state = msgspec.json.decode(line.body).get("state")
        return state if isinstance(state, str) else msgspec.json.encode(state).decode()

    def __iter__(self) -> Iterator[str]:
        return (line.custom_id for line in self._captured.source.each(self._captured.lines))

    def __len__(self) -> int:
        return len(self._captured.lines)


def _digest(custom_id: str) -> bytes:
    return hashlib.blake2b(custom_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _without_model(body: bytes) -> bytes:
    """A captured body asked of each configuration's default model."""
    value = msgspec.json.decode(body)
    value.pop("model", None)
    return msgspec.json.encode(value)


def _state_group(line: Line) -> bytes:
    """Lines of one state (language, facts) go together whatever model they were sent to."""
    body = msgspec.json.decode(line.body)
    return msgspec.json.encode([body.get("state"), body.get("lang"), body.get("facts")])


def read_capture(path: Path) -> Captured:
    return Captured(path)


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


@dataclass
class Configuration:
    """One side of a replay: how it decides a line, what it is, and what to close on the loop that used it."""

    decide: Decide
    name: str
    aclose: Callable[[], Awaitable[None]]


async def _nothing() -> None:
    return None


@contextmanager
def configuration(spec: str, api_key: str | None = None) -> Iterator[Configuration]:
    """A configuration from its spec; a local one's engines are closed on exit (a URL's client by `aclose`)."""
    if is_url(spec):
        yield _remote(spec, api_key)
        return
    from basal.api.decide import body_decider
    from basal.serve.config import DEMO_PATH, ModelConfig, ServeConfig, load_config
    from basal.serve.server import api_settings, build_engines

    path = Path(spec)
    if spec != DEMO_PATH and path.is_file() and path.suffix in (".yaml", ".yml", ".json"):
        config = load_config(path)
    elif spec == DEMO_PATH or path.is_dir():
        config = ServeConfig(models=[ModelConfig(path=spec)])
    else:
        raise ValueError(f"{spec}: not a model directory, `demo`, a configuration file or an http(s):// URL")
    engines = build_engines(config)
    engines.start()
    try:
        yield Configuration(body_decider(engines, api_settings(config)), f"{spec} (model {engines.default})", _nothing)
    finally:
        engines.close(drain=False)


def _remote(url: str, api_key: str | None) -> Configuration:
    import httpx

    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    endpoint = url.rstrip("/") + "/v1/basal"
    clients: list[httpx.AsyncClient] = []

    async def decide(body: bytes, cancelled: Callable[[], bool]) -> tuple[int, bytes, str]:
        if not clients:  # made on the loop that runs the replay
            clients.append(httpx.AsyncClient(timeout=600.0, limits=httpx.Limits(max_connections=64)))
        for attempt in range(8):  # the server's 529 / 503 are "not now": wait and ask again
            r = await clients[0].post(endpoint, content=body, headers=headers)
            if r.status_code not in (503, 529):
                break
            await asyncio.sleep(min(0.25 * 2**attempt, 5.0))
        return r.status_code, r.content, r.headers.get("x-request-id", "")

    async def aclose() -> None:
        for client in clients:
            await client.aclose()

    return Configuration(decide, url, aclose)


async def run(captured: Captured, decide: Decide, on_record: Callable[[], None] = lambda: None) -> dict[str, Outcome]:
    """Every line's outcome under one configuration, by custom_id."""
    out: dict[str, Outcome] = {}

    async def record(chunk: list[tuple[int, bool, bytes]]) -> None:
        for _, _, raw in chunk:
            head = msgspec.json.decode(raw, type=_Head)
            if head.response is not None:
                out[head.custom_id] = Outcome(head.response.status_code, _answer_bytes(raw))
                on_record()

    async def lines() -> AsyncIterator[Line]:
        for line in captured.each():
            yield line

    await run_lines(lines(), decide, record)
    return out


class _Status(msgspec.Struct):
    status_code: int


class _Head(msgspec.Struct):
    custom_id: str
    response: _Status | None = None


def _answer_bytes(record: bytes) -> bytes:
    """The record's `response.body` exactly as the server answered it (`lines.response_record` embeds the answer's
    own bytes between these two markers)."""
    at = record.index(b',"body":') + len(b',"body":')
    return record[at : record.rindex(b'},"error":null}')]

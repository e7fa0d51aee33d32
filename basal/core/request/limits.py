"""Every limit that bounds what one request or one connection may cost, with defaults a real user never hits.

One place, so that the "Limits" table of docs/configuration.md, the YAML ``limits:`` section, the ``basal serve``
flags and the code read the same names. Work limits are checked before the work they bound starts (a request is
refused by counting questions and characters, never after tokenizing or packing it).
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec
from msgspec import Meta

from basal.core.errors import RequestError, over_limit

DAY_S = 86_400.0


class Limits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # work of one request
    max_questions: Annotated[int, Meta(ge=1)] = 1024  # questions per request
    max_request_tokens: Annotated[int, Meta(ge=1)] = 262_144  # packed tokens one request may compute (prefixes once)
    max_request_chars: Annotated[int, Meta(ge=1)] = 16 << 20  # characters of all prompts of a request, before tokens
    max_prompt_chars: int = 0  # characters of one prompt before tokenizing; 0: what the model's context can hold
    # error bodies
    max_errors: Annotated[int, Meta(ge=1)] = 64  # errors listed in one 422
    max_echo_chars: Annotated[int, Meta(ge=1)] = 200  # characters of the request echoed in an error (values, names)
    # connections (uvicorn + basal.api.http.connection_guard)
    max_connections: Annotated[int, Meta(ge=1)] = 2048  # open HTTP connections; more are closed at once
    # the floors below keep a limit one that a real request can pass (less would refuse every request)
    max_header_count: Annotated[int, Meta(ge=8)] = 128  # header lines of one request (431 beyond)
    max_header_bytes: Annotated[int, Meta(ge=1024)] = 65_536  # request line + headers of one request (431 beyond)
    # from connection (or the previous response) to the end of the headers (408); at most a day, as every timeout
    header_timeout_s: Annotated[float, Meta(ge=0.1, le=DAY_S)] = 10.0
    body_timeout_s: Annotated[float, Meta(ge=0.1, le=DAY_S)] = 60.0  # headers' end to body's end (uploads: longest gap)
    max_transit_bytes: Annotated[int, Meta(ge=1 << 16)] = 256 << 20  # bytes of bodies received at once (529 beyond)
    keep_alive_s: Annotated[float, Meta(gt=0, le=DAY_S)] = 5.0  # an idle keep-alive connection is closed after this

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (value == 0 and name != "max_prompt_chars"):
                raise msgspec.ValidationError(f"`limits.{name}` must be a positive finite number, got {value}")


DEFAULT_LIMITS = Limits()


def echo(text: object, limits: Limits = DEFAULT_LIMITS) -> str:
    """A piece of the request quoted in an error message, cut so an error never grows with the request."""
    s = text if isinstance(text, str) else str(text)
    return s if len(s) <= limits.max_echo_chars else s[: limits.max_echo_chars] + "…"


def prompt_over_limit(dialect: str, prompt_char_limit: int, context: int) -> RequestError:
    """The refusal of a prompt longer than the model's characters (`prompt_char_limit`, for `context` tokens):
    one text, whether the parser sees it from the state's size or admission from the planned prompts."""
    return over_limit(
        dialect, f"a prompt has over {prompt_char_limit} characters; the model reads at most {context} tokens"
    )


def check_model_floor(dialect: str, state_chars: int, bound: tuple[int, int] | None) -> None:
    """Refuse, from the state's size alone, a request whose every model prompt repeats a state longer than the
    served model can read: `bound` is that model's (prompt characters, context tokens), None when unknown.
    Called before facts are injected (they only append), so the scan never runs for a request refused anyway."""
    if bound is not None and bound[0] and state_chars > bound[0]:
        raise prompt_over_limit(dialect, *bound)


def check_size_floor(dialect: str, state_chars: int, prompts: int, fixed_chars: int, limits: Limits) -> None:
    """Refuse, from sizes alone, a request whose prompts cannot fit its limits: `prompts` prompts (at least) each
    repeat the `state_chars` characters of the state, plus `fixed_chars` that no prompt shares. Checked before
    facts are injected (they only append) and before a multi's branches are built (labels x questions)."""
    if limits.max_prompt_chars and state_chars > limits.max_prompt_chars:
        raise over_limit(dialect, f"a prompt has over {limits.max_prompt_chars} characters (limits.max_prompt_chars)")
    floor = prompts * state_chars + fixed_chars
    if floor > limits.max_request_chars:
        raise over_limit(
            dialect,
            f"the prompts of this request hold at least {floor} characters; a request may hold at most "
            f"{limits.max_request_chars} (send fewer questions, labels or a shorter state)",
        )

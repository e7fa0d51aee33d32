"""What every configuration value must be, read from the schema's own annotations: the right kind, a finite
number inside the key's range, text of the key's format.

The rules are the same for every key, so a key added to the schema is checked at once: a number is finite and
inside the bounds its `msgspec.Meta` declares (at least 0 and at most `CEILING` where it declares none); a text
key marked with a format (`HostPort`, `IsoDate`, `ApiKey`) is checked by that format; no item of a list of texts
is empty. `value_problem` says what is wrong in the user's words, without the key's name: the caller names the
key (`` `limits.max_questions` ``) or the variable (``BASAL_LIMITS__MAX_QUESTIONS``) it came from.
"""

from __future__ import annotations

import datetime
import math
from typing import Annotated

import msgspec
import msgspec.inspect as mi

CEILING = 2**53  # the largest count, size or time a key takes where it declares no bound of its own

HostPort = Annotated[str, msgspec.Meta(extra={"format": "host:port"})]
IsoDate = Annotated[str, msgspec.Meta(extra={"format": "date"})]
ApiKey = Annotated[str, msgspec.Meta(extra={"format": "api key"})]
DatabaseUrl = Annotated[str, msgspec.Meta(extra={"format": "database"})]


def host_port_problem(text: str) -> str | None:
    """Why `text` is not HOST:PORT with a port from 1 to 65535 (None when it is)."""
    host, _, port = text.rpartition(":")
    if not host or not port:
        return "must be HOST:PORT, e.g. 127.0.0.1:8000 (0.0.0.0:8000 listens on every interface)"
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        return f"has port {port!r}: a port is a whole number from 1 to 65535"
    return None


def date_problem(text: str) -> str | None:
    """Why `text` is not a calendar date written YYYY-MM-DD, in words (None when it is)."""
    parts = text.split("-")
    if len(parts) != 3 or [len(p) for p in parts] != [4, 2, 2] or not all(p.isascii() and p.isdigit() for p in parts):
        return "must be a date written YYYY-MM-DD, e.g. 2026-10-05"
    year, month, day = map(int, parts)
    if year < 1:
        return "has year 0000: the calendar starts at 0001 (YYYY-MM-DD)"
    if not 1 <= month <= 12:
        return f"has month {month}: a month is 01 to 12 (YYYY-MM-DD)"
    try:
        datetime.date(year, month, day)
    except ValueError:
        return f"is not a day of the calendar: {year:04d}-{month:02d} has no day {day} (YYYY-MM-DD)"
    return None


def api_key_problem(text: str) -> str | None:
    """Why `text` cannot be an API key: empty (`Bearer ` with nothing after it would match), or padded."""
    if not text.strip():
        return "is an empty API key: every key must have characters (a template with a missing secret gives '')"
    if text != text.strip():
        return "is an API key that starts or ends with white space, which HTTP trims from a header: remove it"
    return None


def database_problem(text: str) -> str | None:
    """Why `text` names no Batch store: `sqlite` (the default store in `dir`) or a postgresql:// URL."""
    if text == "sqlite" or (text.startswith(("postgresql://", "postgres://")) and len(text.split("://", 1)[1]) > 0):
        return None
    return "is no batch store: write sqlite, or a postgresql://USER:PASSWORD@HOST:PORT/DATABASE URL"


FORMATS = {
    "host:port": host_port_problem,
    "date": date_problem,
    "api key": api_key_problem,
    "database": database_problem,
}


def words(t: mi.Type, fmt: str | None = None) -> str:
    """What a type holds (of format `fmt`, if given), as a user says it."""
    if isinstance(t, mi.Metadata):
        return words(t.type, (t.extra or {}).get("format"))
    if fmt is not None:
        return f"text ({fmt.upper() if fmt == 'host:port' else fmt})"
    if isinstance(t, mi.BoolType):
        return "true or false"
    if isinstance(t, mi.IntType):
        return "a whole number"
    if isinstance(t, mi.FloatType):
        return "a number"
    if isinstance(t, mi.StrType):
        return "text"
    if isinstance(t, mi.ListType):
        item = words(t.item_type)
        return "a list of sections" if item == "a section of keys" else f"a list of {item.removeprefix('a ')}"
    if isinstance(t, mi.StructType | mi.DictType):
        return "a section of keys"
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(map(str, t.values))
    if isinstance(t, mi.UnionType):
        return " or ".join(words(s) for s in t.types if not isinstance(s, mi.NoneType))
    return "a value of another kind"


def _shown(value: object) -> str:
    """A value as a user wrote it, with its kind when a YAML reader may not expect it."""
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (true or false)"
    if isinstance(value, int | float):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        return f"{value[:80]!r} (text)"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a section"
    return f"{type(value).__name__}"


def _range(t: mi.IntType | mi.FloatType, value: float) -> str | None:
    """Why a number is not finite or outside the key's bounds (declared, else 0 to `CEILING`)."""
    if isinstance(t, mi.FloatType) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    low = t.ge if t.ge is not None else t.gt if t.gt is not None else 0
    high = t.le if t.le is not None else t.lt if t.lt is not None else CEILING
    low_ok = value > low if t.gt is not None else value >= low
    high_ok = value < high if t.lt is not None else value <= high
    if low_ok and high_ok:
        return None
    if not low_ok:
        return f"must be {'above' if t.gt is not None else 'at least'} {low:g}, got {value:g}"
    return f"must be {'below' if t.lt is not None else 'at most'} {high:g}, got {value:g}"


def value_problem(t: mi.Type, value: object) -> str | None:
    """What is wrong with `value` for a key of type `t` (None: nothing). Sections and enum values are the
    caller's to check (`config_keys.problems`), which walks into sections; here a section is only checked to be one."""
    fmt = None
    if isinstance(t, mi.Metadata):
        fmt, t = (t.extra or {}).get("format"), t.type
    if isinstance(t, mi.UnionType):
        if value is None and any(isinstance(s, mi.NoneType) for s in t.types):
            return None
        members = [s for s in t.types if not isinstance(s, mi.NoneType)]
        if len(members) != 1:
            return None  # not in this schema; msgspec checks it
        return value_problem(members[0], value)
    if isinstance(t, mi.LiteralType | mi.AnyType):
        return None
    expected = f"is {_shown(value)}: expected {words(t, fmt)}"
    if isinstance(t, mi.StructType | mi.DictType):
        return None if isinstance(value, dict) else expected
    if isinstance(t, mi.BoolType):
        return None if isinstance(value, bool) else expected
    if isinstance(t, mi.IntType):
        if not isinstance(value, int) or isinstance(value, bool):
            return expected
        return _range(t, value)
    if isinstance(t, mi.FloatType):
        if not isinstance(value, int | float) or isinstance(value, bool):
            return expected
        return _range(t, value)
    if isinstance(t, mi.StrType):
        if not isinstance(value, str):
            hint = "; in YAML, put it in quotes" if isinstance(value, int | float | bool) else ""
            return expected + hint
        return FORMATS[fmt](value) if fmt else None
    if isinstance(t, mi.ListType):
        if not isinstance(value, list):
            return expected
        for i, item in enumerate(value):
            if isinstance(item, str) and not item.strip() and not isinstance(t.item_type, mi.Metadata):
                return f"has an empty item ({i + 1} of {len(value)})"
            if problem := value_problem(t.item_type, item):
                return f"has item {i + 1} of {len(value)}, which {problem}"
        return None
    return None

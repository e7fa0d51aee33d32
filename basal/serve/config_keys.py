"""The configuration's keys as a tree read from the structs themselves: for "did you mean", enum values, the README.

msgspec stops at the first unknown key or bad enum value. A user who mistyped three keys should hear about all
three at once, each with the nearest valid key, and an enum error should list what is allowed — so the raw YAML
is walked against the schema first (`problems`, with every value's kind, range and format from `config_values`),
and only a clean tree goes on to `msgspec.convert`.
"""

from __future__ import annotations

import difflib
import functools
import typing

import msgspec
import msgspec.inspect as mi

from basal.serve.config_values import value_problem, words


def _struct_of(t: mi.Type) -> mi.StructType | None:
    """The struct inside a field's type (`X`, `X | None`), if any."""
    if isinstance(t, mi.StructType):
        return t
    if isinstance(t, mi.UnionType):
        return next((s for s in t.types if isinstance(s, mi.StructType)), None)
    return None


def _literal_of(t: mi.Type) -> tuple[object, ...] | None:
    """The allowed values of an enum field (`Literal[...]`, optionally `| None`), in declaration order."""
    if isinstance(t, mi.LiteralType):
        return t.values
    if isinstance(t, mi.UnionType):
        return next((s.values for s in t.types if isinstance(s, mi.LiteralType)), None)
    return None


@functools.cache  # msgspec.inspect walks the whole type each time: 5 ms, asked hundreds of times by the flags
def fields(struct: type[msgspec.Struct]) -> dict[str, mi.Field]:
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType)
    return {f.name: f for f in info.fields}


def enum_values(struct: type[msgspec.Struct], key: str) -> list[str]:
    """The valid values of one enum key, for argparse `choices` and error messages."""
    values = _literal_of(fields(struct)[key].type)
    assert values is not None, f"{struct.__name__}.{key} is not an enum"
    return [str(v) for v in values]


def default_of(struct: type[msgspec.Struct], key: str) -> object:
    """A key's default as the schema declares it (what a flag that is not given means)."""
    f = fields(struct)[key]
    return f.default_factory() if f.default is msgspec.NODEFAULT else f.default


def key_tree(struct: type[msgspec.Struct]) -> dict[str, dict]:
    """Every key, nested: {"addr": {}, "models": {"path": {}, ...}, "limits": {...}, ...} (lists of structs too)."""
    out: dict[str, dict] = {}
    for name, f in fields(struct).items():
        t = f.type.item_type if isinstance(f.type, mi.ListType) else f.type
        inner = _struct_of(t)
        out[name] = key_tree(inner.cls) if inner else {}
    return out


def problems(data: object, struct: type[msgspec.Struct], where: str = "") -> list[str]:
    """Every unknown key (with the nearest valid ones), every enum value outside its choices and every value of
    the wrong kind, out of range or of the wrong format (`config_values`), in `data`."""
    if not isinstance(data, dict):
        return []  # a wrong shape is msgspec's to report
    known = fields(struct)
    out = []
    for key, value in data.items():
        at = f"{where}.{key}" if where else str(key)
        f = known.get(key) if isinstance(key, str) else None
        if f is None:
            near = difflib.get_close_matches(str(key), list(known), n=2, cutoff=0.6)
            hint = f"did you mean {' or '.join(f'`{n}`' for n in near)}?" if near else f"valid here: {', '.join(known)}"
            out.append(f"unknown key `{at}`; {hint}")
            continue
        choices = _literal_of(f.type)
        if choices is not None and value is not None and value not in choices:
            near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            out.append(f"`{at}` is {value!r}: choose one of {', '.join(map(str, choices))}{hint}")
        listed = _struct_of(f.type.item_type) if isinstance(f.type, mi.ListType) else None
        if listed is not None and isinstance(value, list):
            for i, item in enumerate(value):
                if problem := value_problem(listed, item):  # an entry that is not a section
                    out.append(f"`{at}[{i}]` {problem}")
                out += problems(item, listed.cls, f"{at}[{i}]")
        elif listed is None and (inner := _struct_of(f.type)) and isinstance(value, dict):
            out += problems(value, inner.cls, at)
        elif problem := value_problem(f.type, value):  # a value; or a section given as something else
            out.append(f"`{at}` {problem}")
    return out


ENV_PREFIX = "BASAL_"
ENV_SEP = "__"  # a key inside a section: BASAL_LIMITS__MAX_QUESTIONS, BASAL_MODELS__0__PATH
MAX_ENV_INDEX = 255  # BASAL_MODELS__N__...: entries of a list of sections from the environment, numbered from 0


def env_name(path: tuple[str | int, ...]) -> str:
    """The environment variable of one key: ("limits", "max_questions") -> BASAL_LIMITS__MAX_QUESTIONS."""
    return ENV_PREFIX + ENV_SEP.join(str(p).upper() for p in path)


def environment_tree(
    struct: type[msgspec.Struct], environ: dict[str, str], ignore: frozenset[str] = frozenset()
) -> tuple[dict, list[str], list[str]]:
    """The keys the `BASAL_*` variables of `environ` set, as the YAML file's tree with typed values; every value
    that does not fit its key; every variable that names no key (with the nearest valid ones) — all at once.

    A list of plain values is comma-separated (`BASAL_API_KEYS=a,b`); a list of sections takes an index
    (`BASAL_MODELS__0__PATH=...`); booleans are true/false/1/0. `ignore`: other BASAL_ variables of the process
    (`BASAL_HOME`, ...), which are not configuration keys.
    """
    tree: dict = {}
    bad: list[str] = []
    unknown: list[str] = []
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in ignore:
            continue
        path = [p.lower() for p in var[len(ENV_PREFIX) :].split(ENV_SEP)]
        problem = _env_key(struct, path, environ[var], var, tree)
        if problem is not None:
            (unknown if problem.startswith("unknown") else bad).append(problem)
    return tree, bad or _gaps(tree, ()), unknown  # a refused variable leaves its entry empty too


def _gaps(tree: dict, section: tuple[str | int, ...]) -> list[str]:
    """Entries of a list of sections that no variable set (BASAL_MODELS__1__PATH without BASAL_MODELS__0__...)."""
    out = []
    for key, value in tree.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, entry in enumerate(value):
                where = (*section, key, i)
                if not entry:
                    out.append(f"no variable sets {env_name(where)}{ENV_SEP}...: entries are numbered from 0")
                out += _gaps(entry, where)
        elif isinstance(value, dict):
            out += _gaps(value, (*section, key))
    return out


def _env_key(struct: type[msgspec.Struct], path: list[str], raw: str, var: str, tree: dict) -> str | None:
    """Put one variable's value at its place in `tree`; a problem as text (unknown ones start "unknown"), or None."""
    known = fields(struct)
    key, rest = path[0], path[1:]
    f = known.get(key)
    if f is None:
        near = difflib.get_close_matches(key, list(known), n=2, cutoff=0.6)
        section = var[len(ENV_PREFIX) :].split(ENV_SEP)[: -len(path)] if len(path) > 1 else []
        names = [env_name((*section, n)) for n in near]
        return f"unknown variable {var}" + (f"; did you mean {' or '.join(names)}?" if near else "")
    t = f.type.item_type if isinstance(f.type, mi.ListType) else f.type
    inner = _struct_of(t)
    if inner is not None:
        if isinstance(f.type, mi.ListType):
            if len(rest) < 2 or not (rest[0].isascii() and rest[0].isdigit()):
                return f"{var}: `{key}` is a list of sections; name one by its index: {var}{ENV_SEP}0{ENV_SEP}KEY"
            if int(rest[0]) > MAX_ENV_INDEX:
                return f"{var}: the index {rest[0]} is over {MAX_ENV_INDEX}; entries are numbered from 0 without gaps"
            items = tree.setdefault(key, [])
            while len(items) <= int(rest[0]):
                items.append({})
            return _env_key(inner.cls, rest[1:], raw, var, items[int(rest[0])])
        if not rest:
            first = next(iter(fields(inner.cls))).upper()
            return f"{var}: `{key}` is a section; set its keys, e.g. {var}{ENV_SEP}{first}"
        return _env_key(inner.cls, rest, raw, var, tree.setdefault(key, {}))
    if rest:
        return f"unknown variable {var}: `{key}` has no keys inside it"
    value: object = raw
    if isinstance(f.type, mi.ListType):  # an empty item ("a,,b", " , ,") is refused by the item's rules
        value = [v.strip() for v in raw.split(",")] if raw.strip() else []
    try:
        converted = msgspec.convert(value, typing.get_type_hints(struct)[key], strict=False)
    except msgspec.ValidationError as e:
        choices = _literal_of(f.type)
        wanted = f"choose one of {', '.join(map(str, choices))}" if choices else f"expected {words(f.type)}"
        return f"{var}={raw!r}: {wanted}" + ("" if choices or str(e).startswith("Expected") else f" ({e})")
    if problem := value_problem(f.type, converted):
        return f"{var}={raw!r}: {problem}"
    tree[key] = converted
    return None

"""One conversion of a raw value to a field's type, for TOML values, `--set` text and the
UI form alike, with one set of messages that name the key (and one for unknown keys)."""

from __future__ import annotations

import difflib
import math
import tomllib
from typing import Any, get_args, get_origin

from core.problems import ConfigError, Problem, error

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def type_name(tp: Any) -> str:
    """The field type as a message says it: "an integer", "a list of strings", ..."""
    return _TYPE_NAMES.get(tp, "a list of strings" if get_origin(tp) is list else str(tp))


def unknown_key(key: str, name: str, known: list[str]) -> Problem:
    """An unknown key, with the closest known one (or the list of known keys)."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else f"; known keys: {', '.join(known)}"
    return error(key, f"unknown key{hint}")


def _has_type(raw: Any, tp: Any) -> bool:
    """A TOML value of the field's own type (an int stands for a float)."""
    if tp is bool or tp is str:
        return isinstance(raw, tp)
    if tp is int or tp is float:
        allowed = int if tp is int else int | float
        return isinstance(raw, allowed) and not isinstance(raw, bool)
    return isinstance(raw, list) and all(isinstance(v, str) for v in raw)


def convert_value(key: str, tp: Any, raw: Any, *, strict: bool = False) -> Any:
    """`raw` as a value of field type `tp`, or a ConfigError naming `key`.

    Typed values (form widgets) are checked: an int stands for a float and a whole float
    for an int. Text (`--set`) is parsed: `true`/`off`, `1_000`, `2e-4`, a list as a TOML
    array `["a", "b"]` or as its one item. `strict` (a TOML file, which has types of its
    own) takes only a value of the field's type: "20" is not a number there. Numbers must
    be finite.
    """
    convert = _CONVERTERS.get(tp)
    if convert is None and get_origin(tp) is list and get_args(tp) == (str,):
        convert = _to_strings
    if convert is None:
        raise TypeError(f"unsupported field type for {key}: {tp}")
    if strict and not _has_type(raw, tp):
        raise ConfigError([error(key, f"expected {type_name(tp)}, got {raw!r}")])
    try:
        return convert(raw, tp)
    except ValueError as exc:  # a parse error, or an _Invalid with its own message
        own = str(exc) if isinstance(exc, _Invalid) else ""
        raise ConfigError([error(key, own or f"expected {type_name(tp)}, got {raw!r}")]) from None


class _Invalid(ValueError):
    """A value the field cannot take; a message replaces "expected <type>, got <raw>"."""


def _to_str(raw: Any, tp: Any) -> str:
    if not isinstance(raw, str):
        raise _Invalid
    return raw


def _to_bool(raw: Any, tp: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    word = raw.strip().lower() if isinstance(raw, str) else None
    if word not in _TRUE | _FALSE:
        raise _Invalid
    return word in _TRUE


def _to_number(raw: Any, tp: Any) -> int | float:
    if raw is None or isinstance(raw, str) and not raw.strip():
        raise _Invalid(f"is empty; enter {type_name(tp)}")
    value = raw
    if isinstance(raw, str):
        value = int(raw.strip().replace("_", "")) if tp is int else float(raw.strip())
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Invalid
    if tp is float:
        return float(value)
    if value != int(value):
        raise _Invalid(f"must be a whole number, got {raw}")
    return int(value)


def _to_strings(raw: Any, tp: Any) -> list[str]:
    value = raw
    if isinstance(raw, str):
        if not raw.strip().startswith("["):
            return [raw]
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    if isinstance(raw, str):
        raise _Invalid(f'expected a list like ["a", "b"], got {raw!r}')
    raise _Invalid


_CONVERTERS = {str: _to_str, bool: _to_bool, int: _to_number, float: _to_number}

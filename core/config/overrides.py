"""`--set key=value`: dotted keys with list indices (`datasets.0.repeats=3`), the text
converted to the field's type by the same `convert_value` as TOML values."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any, get_args, get_origin, get_type_hints

from core.config.schema import Config, DatasetConfig
from core.config.values import convert_value, unknown_key
from core.problems import ConfigError, Problem, error


def _split_override(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError([error(item, "--set expects key=value, e.g. train.max_steps=20")])
    return key.strip(), value


def _resolve_target(cfg: Config, key: str) -> tuple[Any, str]:
    """Walk a dotted key to (object, field name); `datasets.N` with N == len appends one."""
    parts = key.split(".")
    obj: Any = cfg
    for depth, part in enumerate(parts[:-1]):
        here = ".".join(parts[: depth + 1])
        if isinstance(obj, list):
            if not part.isdigit():
                raise ConfigError([error(key, f"'{here}' needs a list index")])
            index = int(part)
            if index == len(obj) and obj is cfg.datasets:
                obj.append(DatasetConfig(id=f"data{index}"))
            if index >= len(obj):
                raise ConfigError([error(key, f"index {index} out of range ({len(obj)} items)")])
            obj = obj[index]
            continue
        names = [f.name for f in fields(obj)]
        if part not in names:
            raise ConfigError([unknown_key(key, part, names)])
        obj = getattr(obj, part)
    return obj, parts[-1]


def apply_override(cfg: Config, item: str) -> None:
    """Apply one `key=value`, converting the text to the field's type."""
    key, text = _split_override(item)
    obj, name = _resolve_target(cfg, key)
    if isinstance(obj, list):
        if not name.isdigit() or int(name) > len(obj) or obj is cfg.datasets:
            raise ConfigError([error(key, "expected a list index within range")])
        if int(name) == len(obj):
            obj.append(text)
        else:
            obj[int(name)] = text
        return
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise ConfigError([error(key, "is not a settable key")])
    names = [f.name for f in fields(obj)]
    if name not in names:
        raise ConfigError([unknown_key(key, name, names)])
    tp = get_type_hints(type(obj))[name]
    if dataclasses.is_dataclass(tp) or get_origin(tp) is list and get_args(tp) != (str,):
        raise ConfigError([error(key, "is a section; set one of its keys instead")])
    setattr(obj, name, convert_value(key, tp, text))


def apply_overrides(cfg: Config, items: list[str]) -> Config:
    """Apply every override, collecting all problems before raising."""
    problems: list[Problem] = []
    for item in items:
        try:
            apply_override(cfg, item)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return cfg

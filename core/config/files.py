"""The config as TOML: read it (collecting every unknown key and wrong type) and write it
in the canonical form presets are stored in, so they round-trip exactly."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

import tomli_w

from core.config.family_options import owner
from core.config.schema import CONFIG_VERSION, SECTION_TYPES, SECTIONS, Config, DatasetConfig
from core.config.values import convert_value, unknown_key
from core.files import write_text
from core.problems import ConfigError, Problem, error

# ---------------------------------------------------------------- reading


def _build_section(cls: type, data: Any, prefix: str, problems: list[Problem]) -> Any:
    if not isinstance(data, dict):
        problems.append(error(prefix, f"expected a table, got {data!r}"))
        return cls()
    hints = get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}.{name}"
        if name not in known:
            problems.append(unknown_key(key, name, known))
            continue
        try:
            kwargs[name] = convert_value(key, hints[name], value, strict=True)
        except ConfigError as exc:
            problems.extend(exc.problems)
    return cls(**kwargs)


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build a Config from parsed TOML, collecting every unknown key and type error."""
    problems: list[Problem] = []
    version = data.get("version", CONFIG_VERSION)
    if version != CONFIG_VERSION:
        problems.append(error("version", f"unsupported config version {version!r}; "
                                         f"this app reads version {CONFIG_VERSION}"))
    cfg = Config()
    for name, value in data.items():
        if name == "version":
            continue
        if name not in SECTIONS:
            problems.append(unknown_key(name, name, ["version", *SECTIONS]))
        elif name == "datasets":
            if not isinstance(value, list):
                problems.append(error("datasets", "expected [[datasets]] tables"))
                continue
            cfg.datasets = [
                _build_section(DatasetConfig, item, f"datasets.{i}", problems)
                for i, item in enumerate(value)
            ]
        else:
            setattr(cfg, name, _build_section(SECTION_TYPES[name], value, name, problems))
    if problems:
        raise ConfigError(problems)
    return cfg


def loads_config(text: str, source: str = "<config>") -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([error(source, f"not valid TOML: {exc}")]) from None
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(with_lines(exc.problems, text)) from None


UNKNOWN = "unknown key"


def with_lines(problems: list[Problem], text: str) -> list[Problem]:
    """Each unknown key's message names its line in `text` ("unknown key on line 7
    (did you mean ...)"), so a long file's typo is found at once."""
    lines = key_lines(text)
    return [dataclasses.replace(p, message=f"{UNKNOWN} on line {lines[p.where]}"
                                           f"{p.message[len(UNKNOWN):]}")
            if p.message.startswith(UNKNOWN) and p.where in lines else p
            for p in problems]


_KEY = re.compile(r"""^([A-Za-z0-9_-]+|"[^"]*"|'[^']*')\s*=""")
_TABLE = re.compile(r"^(\[\[?)\s*([^\]]+?)\s*\]")


def key_lines(text: str) -> dict[str, int]:
    """Where each key of a config's TOML is first written, by its dotted name (a
    dataset's as `datasets.N.key`; a table by its name), 1-based; lines inside a
    multi-line string are skipped."""
    found: dict[str, int] = {}
    table, in_string = "", False
    counts: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if in_string or not stripped or stripped.startswith("#"):
            in_string ^= (line.count('"""') + line.count("'''")) % 2 == 1
            continue
        in_string = (line.count('"""') + line.count("'''")) % 2 == 1
        if (table_match := _TABLE.match(stripped)) is not None:
            table = table_match[2]
            if table_match[1] == "[[":
                counts[table] = counts.get(table, -1) + 1
                table = f"{table}.{counts[table]}"
            found.setdefault(table, number)
        elif (key_match := _KEY.match(stripped)) is not None:
            name = key_match[1].strip("\"'")
            found.setdefault(f"{table}.{name}" if table else name, number)
    return found


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([error(str(path), "config file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([error(str(path), f"cannot read config: {exc}")]) from None
    return loads_config(text, str(path))


# ---------------------------------------------------------------- writing


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dumps_config(cfg: Config) -> str:
    """Canonical TOML: `version`, then every section with every key, in declaration order
    (no datasets: no `[[datasets]]` table). Presets are stored in this form. Keys whose
    tag does not hold for model.family are left out where core/models/tags.py says so
    (a video family's clip keys for a still family, an edit family's control keys, ...),
    and a family's own keys (its options.py) for any other family; loading gives them
    their defaults."""
    from core.models.tags import dropped_tags

    data = config_to_dict(cfg)
    unused = dropped_tags(cfg.model.family)
    for section, table in [("datasets", d) for d in data["datasets"]] + [
            (name, data[name]) for name in SECTION_TYPES]:
        for key in _tagged_keys(section, unused) + _other_families_keys(section, cfg):
            table.pop(key, None)
    if not data["datasets"]:
        del data["datasets"]  # tomli_w would write `datasets = []` above [model]
    return tomli_w.dumps(data)


def _tagged_keys(section: str, tags: list[str]) -> list[str]:
    """The keys of a section (or of a dataset) whose metadata carries one of `tags`
    ("video": they apply to video families only; "edit": to edit families)."""
    cls = DatasetConfig if section == "datasets" else SECTION_TYPES[section]
    return [f.name for f in dataclasses.fields(cls) if any(f.metadata.get(t) for t in tags)]


def _other_families_keys(section: str, cfg: Config) -> list[str]:
    """The keys of a section that another family than model.family declares (its
    options.py), left out of the saved file as a video key is for a still family."""
    if section == "datasets":
        return []
    return [f.name for f in dataclasses.fields(SECTION_TYPES[section])
            if owner(f) not in ("", cfg.model.family)]


def save_config(cfg: Config, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a temp name per process: two writers never share one
    write_text(path, dumps_config(cfg), temp=f".{path.name}.{os.getpid()}.tmp")

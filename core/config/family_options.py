"""A family's own config keys (its folder's options.py, `OPTIONS = {section: dataclass}`)
merged into a section of the schema, so `--set`, TOML, the check, the UI form and
docs/config.md read them as any key, with the key's spelling unchanged for users.

Each merged field's metadata carries `family` (its owner): the form shows it for that
family only, a saved config leaves it out for the others, and the check refuses it set
on another family (`foreign_key_problems`)."""

from __future__ import annotations

import dataclasses
from typing import Any, get_type_hints


def with_family_options(section: str, shared: type, name: str) -> type:
    """`shared` (the section's dataclass of shared keys) extended with every family's
    keys of `section`: the dataclass `name` of core.config.schema. A key declared twice,
    by two families or by a family and the shared section, is an error named here."""
    from core.models.registry import family_options

    taken = {f.name: "the shared schema" for f in dataclasses.fields(shared)}
    extra: list[tuple[str, Any, Any]] = []
    for family, options in family_options(section):
        hints = get_type_hints(options)
        for f in dataclasses.fields(options):
            if f.name in taken:
                raise TypeError(f"{section}.{f.name}: declared by {family}'s options.py and "
                                f"by {taken[f.name]}; give it another name")
            taken[f.name] = f"{family}'s options.py"
            extra.append((f.name, hints[f.name], dataclasses.field(
                default=f.default, default_factory=f.default_factory,
                metadata={**f.metadata, "family": family})))
    merged = dataclasses.make_dataclass(name, extra, bases=(shared,))
    merged.__module__ = shared.__module__  # pickles and reprs as core.config.schema.<name>
    merged.__doc__ = shared.__doc__
    return merged


def owner(f: dataclasses.Field) -> str:
    """The family a key belongs to ("" for a shared key)."""
    return str(f.metadata.get("family") or "")


def foreign_key_problems(cfg: Any) -> list[Any]:
    """A family's own key set (not its default) while model.family is another family:
    an error naming the key and its family, as the run would not read it."""
    from core.problems import error

    out = []
    for section in ("model", "train"):
        table = getattr(cfg, section)
        for f in dataclasses.fields(table):
            family = owner(f)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
                else f.default
            if family in ("", cfg.model.family) or getattr(table, f.name) == default:
                continue
            out.append(error(f"{section}.{f.name}", (
                f"is {getattr(table, f.name)!r}, but it is a {family} key and "
                f"model.family = {cfg.model.family!r} does not read it; set it back to "
                f"{default!r} or remove it")))
    return out

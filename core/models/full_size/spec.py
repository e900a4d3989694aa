"""What the shipped full-size configs say, read without torch: the components of
random:<family> and the `--stage check` of a random: model.path.

Each <family>/ folder is a diffusers-folder layout without weights or tokenizer files:
model_index.json names the real pipeline class and every component's (library, class);
the models' configs sit in <component>/config.json, the scheduler's in
scheduler/scheduler_config.json. Tokenizers are not shipped: the builder uses the tiny
byte-level ones (core/models/tiny), whose ids fall inside the real vocabularies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.models.full_size import RANDOM_PREFIX, family_of, full_size_dir, variants
from core.models.registry import get_family, list_families
from core.models.source import model_source
from core.problems import Problem, error

MODEL_PREFIXES = ("unet", "transformer", "vae", "text_encoder")


class FullSizeConfigError(ValueError):
    """A shipped config is missing or unreadable (a broken checkout), or the family is
    unknown."""


def random_family(path: str) -> str | None:
    """The family part of `random:<family>`, or None for any other model.path."""
    source = model_source(path)
    return source.name if source.kind == "random" else None


def require_family(name: str) -> None:
    if family_of(name) not in list_families():
        raise FullSizeConfigError(
            f"unknown model 'random:{name}'; choose one of "
            + ", ".join(RANDOM_PREFIX + f for f in list_families()))
    if not full_size_dir(name).is_dir():
        raise FullSizeConfigError(
            f"unknown model 'random:{name}'; {family_of(name)} ships random:{family_of(name)}"
            + "".join(f", random:{v}" for v in variants(family_of(name))))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FullSizeConfigError(f"shipped config {path} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise FullSizeConfigError(f"shipped config {path} is not a JSON object")
    return data


def model_index(family: str) -> dict[str, Any]:
    require_family(family)
    return _read_json(full_size_dir(family) / "model_index.json")


def component_specs(family: str) -> dict[str, tuple[str, str]]:
    """Every component model_index.json names with a class: name -> (library, class).
    Components the real index leaves empty ([null, null]) are not listed."""
    out: dict[str, tuple[str, str]] = {}
    for name, value in sorted(model_index(family).items()):
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue
        library, cls = value
        if library and cls:
            out[name] = (str(library), str(cls))
    return out


def model_components(family: str) -> dict[str, tuple[str, str]]:
    """The torch modules (denoiser, VAE, text encoders): name -> (library, class)."""
    return {name: spec for name, spec in component_specs(family).items()
            if name.startswith(MODEL_PREFIXES)}


def component_config(family: str, name: str) -> dict[str, Any]:
    """A component's shipped config (the scheduler's scheduler_config.json)."""
    file = "scheduler_config.json" if name == "scheduler" else "config.json"
    return _read_json(full_size_dir(family) / name / file)


def check_random_source(path: str, family: str, where: str = "model.path") -> list[Problem]:
    """`--stage check` of a random:<family> model.path: the family part must be known and
    equal model.family, and every shipped config must read. No torch, no weights."""
    name = random_family(path)
    if name is None:
        return []
    name, variant = family_of(name), name
    if name in list_families() and not full_size_dir(variant).is_dir():
        return [error(where, f"{path} is not shipped; {name} ships "
                      + ", ".join(RANDOM_PREFIX + v for v in [name, *variants(name)]))]
    if name not in list_families():
        return [error(where, f"{path} names an unknown family {name!r}; use one of "
                      + ", ".join(RANDOM_PREFIX + f for f in list_families()))]
    if name != family:
        return [error(where, f"{path} is a {name} model but model.family is {family}; "
                      f"use {RANDOM_PREFIX}{family}")]
    try:
        index = model_index(variant)
        # The real checkpoint's pipeline: the family's own (flux2: klein's); a variant's
        # one of the family's pipelines (FLUX.2-dev's Flux2Pipeline).
        expected = get_family(name).pipeline_class_name
        found = str(index.get("_class_name"))
        if found != expected and not (variant != name and found.startswith(
                get_family(name).pipeline_prefix or expected)):
            raise FullSizeConfigError(f"{full_size_dir(variant)}/model_index.json names "
                                      f"{found!r}, not {expected}")
        for component in (*model_components(variant), "scheduler"):
            component_config(variant, component)
    except FullSizeConfigError as exc:
        return [error(where, f"{path}: {exc}; the repository checkout is incomplete")]
    return []

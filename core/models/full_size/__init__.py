"""Full-size architectures with random weights: `random:<family>` in model.path.

core/models/families/<family>/full_size/ holds the real model's configs in diffusers-folder
layout (model_index.json, <component>/config.json, scheduler/scheduler_config.json), no
weights.
"""

from __future__ import annotations

from pathlib import Path

from core.models.source import RANDOM_PREFIX  # noqa: F401  (the prefix, decided in one place)


def family_of(name: str) -> str:
    """The family of a random model's name: `wan` of `wan` and of `wan:14b`."""
    return name.partition(":")[0]


def full_size_dir(name: str) -> Path:
    """The folder of configs for random:<family>: full_size/ in the family's folder; for
    a variant, random:<family>:<variant> (random:wan:14b), full_size_<variant>/ beside it."""
    from core.models.registry import family_module

    family, _, variant = name.partition(":")
    folder = Path(family_module(family).__file__).parent
    return folder / (f"full_size_{variant}" if variant else "full_size")


def variants(family: str) -> list[str]:
    """The random:<family>:<variant> names the family's folder ships configs for."""
    folder = full_size_dir(family).parent
    return sorted(f"{family}:{p.name.removeprefix('full_size_')}"
                  for p in folder.glob("full_size_*") if p.is_dir())

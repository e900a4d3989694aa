"""Full-size architectures with random weights: `random:<family>` in model.path.

core/models/families/<family>/full_size/ holds the real model's configs in diffusers-folder
layout (model_index.json, <component>/config.json, scheduler/scheduler_config.json), no
weights.
"""

from __future__ import annotations

from pathlib import Path

from core.models.source import RANDOM_PREFIX  # noqa: F401  (the prefix, decided in one place)


def full_size_dir(family: str) -> Path:
    """The folder of configs for random:<family>: full_size/ in the family's folder."""
    from core.models.registry import family_module

    return Path(family_module(family).__file__).parent / "full_size"

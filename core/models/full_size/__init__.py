"""Full-size architectures with random weights: `random:<family>` in model.path.

<family>/ holds the real model's configs in diffusers-folder layout (model_index.json,
<component>/config.json, scheduler/scheduler_config.json), no weights.
"""

from __future__ import annotations

from pathlib import Path

RANDOM_PREFIX = "random:"


def full_size_dir(family: str) -> Path:
    """The folder of configs for random:<family>."""
    return Path(__file__).parent / family

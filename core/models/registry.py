"""Find a model family by name without importing torch until one is used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.models.base import ModelFamily

FAMILY_NAMES: tuple[str, ...] = ("sd15", "sd2", "sdxl", "sd3", "flux", "flux2", "chroma",
                                  "z_image", "qwen_image")
# Families trained by flow matching: their target is fixed, so model.prediction_type (the
# epsilon/v choice of the others) must stay "auto". Each FAMILY's `prediction` agrees.
FLOW_FAMILIES: tuple[str, ...] = ("sd3", "flux", "flux2", "chroma", "z_image", "qwen_image")
# Families with guidance-distilled models (FLUX.1-dev, FLUX.2-dev: a guidance embedding
# given a value in training, train.guidance). Each FAMILY's `train_guidance` agrees.
GUIDANCE_FAMILIES: tuple[str, ...] = ("flux", "flux2")


def list_families() -> list[str]:
    """Every family name, in display order (no heavy import)."""
    return list(FAMILY_NAMES)


def get_family(name: str) -> ModelFamily:
    """The `FAMILY` object of core.models.<name>; imports that module on first use."""
    if name not in FAMILY_NAMES:
        raise ValueError(f"unknown model family {name!r}; choose one of "
                         f"{', '.join(FAMILY_NAMES)}")
    module = importlib.import_module(f"core.models.{name}")
    return module.FAMILY

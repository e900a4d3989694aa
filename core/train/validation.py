"""Validation images: fixed prompts and seeds, saved as validation/step_NNNNNN/00.png."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import ValidationConfig
from core.runs.folder import RunFolder

if TYPE_CHECKING:
    from core.models.base import Components, ModelFamily


def generate_validation_images(family: ModelFamily, components: Components,
                               cfg: ValidationConfig, run_dir: Path, step: int,
                               device: Any) -> list[Path]:
    """One image per prompt, each from seed `cfg.seed + index`, written atomically so a
    watcher never shows half a PNG."""
    import torch

    if not cfg.prompts:
        return []
    pipe = family.validation_pipeline(components)
    folder = RunFolder(run_dir).validation_step(step)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for index, prompt in enumerate(cfg.prompts):
        generator = torch.Generator(device="cpu").manual_seed(cfg.seed + index)
        with torch.no_grad():
            image = pipe(prompt=prompt, num_inference_steps=cfg.steps,
                         guidance_scale=cfg.guidance_scale, height=cfg.resolution,
                         width=cfg.resolution, generator=generator).images[0]
        path = folder / f"{index:02d}.png"
        tmp = folder / f".{index:02d}.png.tmp"
        image.save(tmp, format="PNG")
        os.replace(tmp, path)
        written.append(path)
    return written

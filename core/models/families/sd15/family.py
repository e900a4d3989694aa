"""Stable Diffusion 1.x: UNet + one CLIP text encoder, epsilon prediction. The code is
core/models/stable_diffusion.py's `StableDiffusionFamily`, which the other SD UNet
families (sd2, sdxl) subclass too; this folder adds its name, its single-file markers and
its text width (768), which tells an SD1 model from an SD2 one.
"""

from __future__ import annotations

from core.models.capabilities import SingleFileSpec
from core.models.stable_diffusion import StableDiffusionFamily


class StableDiffusion1Family(StableDiffusionFamily):
    name = "sd15"
    text_width = 768
    # Original-format single files and diffusers folders (core/models/loading.py).
    # last: any SD UNet's keys
    single_file = SingleFileSpec(
        markers=("cond_stage_model.transformer.", "model.diffusion_model.input_blocks."),
        rank=90,
        checkpoint_text_encoders=(("text_encoder", "cond_stage_model.transformer.", "clip"),))
    # The demo's base, tiny:sd15-shapes: this architecture with committed trained weights.
    trained_tiny = (("sd15-shapes", "core.models.families.sd15.shapes"),)


FAMILY = StableDiffusion1Family()

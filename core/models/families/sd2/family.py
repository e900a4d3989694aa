"""Stable Diffusion 2.x: the SD UNet with an OpenCLIP text encoder (1024 wide in the real
models, stored by diffusers as a CLIPTextModel) and, for the 768 px models,
v-prediction.

SD 2 base (512 px) is epsilon: training always follows the loaded scheduler's
`prediction_type`, so both variants train correctly under this family; `prediction`
below is the family's usual kind and what the tiny model uses. Everything else is
StableDiffusionFamily's; `_check_loaded` there tells SD1 from SD2 by the text width.
"""

from __future__ import annotations

from core.models.families.sd15.family import StableDiffusionFamily


class StableDiffusion2Family(StableDiffusionFamily):
    name = "sd2"
    prediction = "v_prediction"


FAMILY = StableDiffusion2Family()

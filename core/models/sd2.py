"""Stable Diffusion 2.x: the SD UNet with an OpenCLIP text encoder (1024 wide in the real
models, stored by diffusers as a CLIPTextModel) and, for the 768 px models,
v-prediction.

SD 2 base (512 px) is epsilon: training always follows the loaded scheduler's
`prediction_type`, so both variants train correctly under this family; `prediction`
below is the family's usual kind and what the tiny model uses.
"""

from __future__ import annotations

from typing import Any

from core.models.sd15 import StableDiffusionFamily, tiny_clip_config


class StableDiffusion2Family(StableDiffusionFamily):
    name = "sd2"
    prediction = "v_prediction"
    default_resolution = 768
    tiny_pad_token = "!"  # the real SD2 tokenizer pads with "!", not EOS

    def tiny_scheduler(self) -> Any:
        from diffusers import DDIMScheduler

        return DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                             num_train_timesteps=1000, clip_sample=False,
                             set_alpha_to_one=False, steps_offset=1,
                             prediction_type=self.prediction)

    def tiny_unet_extra(self) -> dict[str, Any]:
        # SD2 uses linear projections in its transformer blocks and per-level head sizes.
        return {"use_linear_projection": True, "attention_head_dim": (2, 4)}

    def tiny_text_config(self) -> Any:
        return tiny_clip_config(hidden_act="gelu")  # OpenCLIP uses exact GELU


FAMILY = StableDiffusion2Family()

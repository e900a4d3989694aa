"""Stable Diffusion 2.x: the SD UNet with an OpenCLIP text encoder (1024 wide in the real
models, stored by diffusers as a CLIPTextModel) and, for the 768 px models,
v-prediction.

SD 2 base (512 px) is epsilon: training always follows the loaded scheduler's
`prediction_type`, so both variants train correctly under this family; `prediction`
below is the family's usual kind and what the tiny model uses. Everything else is
StableDiffusionFamily's (core/models/stable_diffusion.py); its `_check_loaded` tells SD1
from SD2 by the text width (`text_width`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from core.models.capabilities import SingleFileSpec
from core.models.stable_diffusion import StableDiffusionFamily


def single_file_problems(config: str, prediction_type: str) -> list[Any]:
    """diffusers reads an SD2 file without model.config as SD2-768 (v_prediction)."""
    from core.problems import warning

    if config or prediction_type != "auto":
        return []
    return [warning("model.prediction_type", "is auto and model.config is empty, so "
                    "this SD2 single file trains with diffusers' default SD2 configs "
                    "(768 px, v_prediction); for an SD2-base (512 px, epsilon) file set "
                    "model.prediction_type = \"epsilon\" or model.config to an SD2-base "
                    "diffusers folder")]


class StableDiffusion2Family(StableDiffusionFamily):
    name = "sd2"
    text_width = 1024  # OpenCLIP ViT-H's, which tells an SD2 model from an SD1 one
    # Original-format single files and diffusers folders (core/models/loading.py).
    single_file = SingleFileSpec(
        markers=("cond_stage_model.model.",), rank=80, problems=single_file_problems,
        checkpoint_text_encoders=(("text_encoder", "cond_stage_model.model.", "open_clip"),))
    pipeline_prefix = "StableDiffusion"
    prediction = "v_prediction"
    # the shared scheduler; OpenCLIP's tokenizer pads with "!"
    random = dataclasses.replace(StableDiffusionFamily.random,
                                 bang_padded_tokenizers=("tokenizer",))


FAMILY = StableDiffusion2Family()

"""`tiny:hunyuan_video15_i2v`: a tiny random HunyuanVideo 1.5 image-to-video model
(HunyuanVideo15ImageToVideoPipeline): tiny:hunyuan_video15's parts from the same seeds
(its transformer configured for i2v), and a two-layer SigLIP vision encoder with its
processor at 32 pixels (patch 8: 16 image tokens, image_embed_dim wide) in place of the
real 384-pixel SigLIP's 729 tokens (../tiny.py, `build_pipeline`).

Why a package with a weights.safetensors: `trained_tiny` names a package whose `build`
the tiny machinery imports and whose weights.safetensors it hashes into the built
folder's marker (core/models/tiny/recipe.py). The model is random, so the file holds no
tensors; its metadata (`RECIPE`) names the variant, and a changed recipe rebuilds every
copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

WEIGHTS = Path(__file__).with_name("weights.safetensors")
RECIPE = {"variant": "hunyuan-video-1.5-i2v", "image_size": "32"}
IMAGE_SIZE = 32


def write_recipe(path: Path = WEIGHTS) -> None:
    """The tensor-less weights.safetensors whose metadata is RECIPE."""
    from core.models.tiny.recipe import write_recipe as write

    write(path, RECIPE)


def tiny_image_encoder(seed: int) -> dict[str, Any]:
    """A two-layer SiglipVisionModel (the pipeline reads its last hidden state) and a
    SiglipImageProcessor at IMAGE_SIZE, offline from configs."""
    import torch
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    from core.models.families.hunyuan_video15.tiny import IMAGE_DIM

    torch.manual_seed(seed)
    config = SiglipVisionConfig(hidden_size=IMAGE_DIM, intermediate_size=32,
                                num_hidden_layers=2, num_attention_heads=2,
                                image_size=IMAGE_SIZE, patch_size=8)
    processor = SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return {"image_encoder": SiglipVisionModel(config).eval(), "feature_extractor": processor}


def build(out_dir: Path, seed: int = 0) -> None:
    """Write tiny:hunyuan_video15_i2v as a diffusers folder."""
    from core.models.families.hunyuan_video15.i2v import I2V_PIPELINE
    from core.models.families.hunyuan_video15.tiny import build_pipeline

    build_pipeline(out_dir, seed, extra=tiny_image_encoder(seed + 4), pipeline=I2V_PIPELINE,
                   task="i2v")

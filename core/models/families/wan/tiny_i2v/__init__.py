"""`tiny:wan_i2v`: a tiny random Wan 2.1 image-to-video model (WanImageToVideoPipeline):
tiny:wan's VAE, UMT5 encoder, tokenizer and scheduler, a one-block transformer taking 36
input channels and image embeds, and a two-layer CLIP vision encoder with its processor
at 32 pixels (../tiny.py, `build_pipeline(i2v=True)`).

Why a package with a weights.safetensors: as tiny22/ explains, `trained_tiny` names a
package whose `build` the tiny machinery imports and whose weights.safetensors it hashes
into the built folder's marker. The model is random, so the file holds no tensors; its
metadata (`RECIPE`) names the variant, and a changed recipe rebuilds every copy.
"""

from __future__ import annotations

from pathlib import Path

WEIGHTS = Path(__file__).with_name("weights.safetensors")
RECIPE = {"variant": "wan2.1-i2v", "image_size": "32"}


def write_recipe(path: Path = WEIGHTS) -> None:
    """The tensor-less weights.safetensors whose metadata is RECIPE."""
    from core.models.tiny.recipe import write_recipe as write

    write(path, RECIPE)


def build(out_dir: Path, seed: int = 0) -> None:
    """Write tiny:wan_i2v as a diffusers folder (WanImageToVideoPipeline)."""
    from core.models.families.wan.tiny import build_pipeline

    build_pipeline(out_dir, seed, i2v=True)

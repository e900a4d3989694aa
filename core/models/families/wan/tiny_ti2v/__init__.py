"""`tiny:wan_ti2v`: a tiny random Wan 2.2 TI2V-5B-shaped model (WanPipeline with
`expand_timesteps`): Wan 2.2's residual VAE at tiny width (48 latent channels, 2x2 pixel
patches, 16x in space, 4x in time, latents_mean/latents_std calibrated), a one-block
transformer taking and giving 48 channels, and tiny:wan's UMT5 encoder, tokenizer and
scheduler (../tiny.py, `build_pipeline(ti2v=True)`).

Why a package with a weights.safetensors: as tiny22/ explains, `trained_tiny` names a
package whose `build` the tiny machinery imports and whose weights.safetensors it hashes
into the built folder's marker. The model is random (drawn from the build seed), so the
file holds no tensors; its metadata (`RECIPE`) names the variant, and a changed recipe
rebuilds every copy.
"""

from __future__ import annotations

from pathlib import Path

WEIGHTS = Path(__file__).with_name("weights.safetensors")
RECIPE = {"variant": "wan2.2-ti2v-5b", "z_dim": "48", "vae_patch_size": "2"}


def write_recipe(path: Path = WEIGHTS) -> None:
    """The tensor-less weights.safetensors whose metadata is RECIPE."""
    from core.models.tiny.recipe import write_recipe as write

    write(path, RECIPE)


def build(out_dir: Path, seed: int = 0) -> None:
    """Write tiny:wan_ti2v as a diffusers folder (WanPipeline, expand_timesteps=True)."""
    from core.models.families.wan.tiny import build_pipeline

    build_pipeline(out_dir, seed, ti2v=True)

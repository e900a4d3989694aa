"""`tiny:qwen_image_edit_plus`: a tiny random Qwen-Image-Edit-2511-shaped model, a
QwenImageEditPlusPipeline (several references) whose transformer has zero_cond_t (2511's
timestep 0 for the reference tokens), with tiny:qwen_image_edit's parts (../tiny.py).

Why a package with a tensor-less weights.safetensors: core/models/tiny/recipe.py.
"""

from __future__ import annotations

from pathlib import Path

WEIGHTS = Path(__file__).with_name("weights.safetensors")
RECIPE = {"pipeline": "QwenImageEditPlusPipeline", "zero_cond_t": "true"}
TINY_REVISION = 1  # as ../tiny.py's: its processor/ folder's files


def write_recipe(path: Path = WEIGHTS) -> None:
    """The tensor-less weights.safetensors whose metadata is RECIPE."""
    from core.models.tiny.recipe import write_recipe as write

    write(path, RECIPE)


def build(out_dir: Path, seed: int = 0) -> None:
    """Write tiny:qwen_image_edit_plus as a diffusers folder."""
    from core.models.families.qwen_image_edit.tiny import build_pipeline
    from core.models.tiny.recipe import read_recipe

    recipe = read_recipe(WEIGHTS)
    build_pipeline(out_dir, seed, recipe["pipeline"], zero_cond_t=recipe["zero_cond_t"] == "true")

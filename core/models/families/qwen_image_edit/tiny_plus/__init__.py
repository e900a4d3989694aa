"""`tiny:qwen_image_edit_plus`: a tiny random Qwen-Image-Edit-2511-shaped model, a
QwenImageEditPlusPipeline (several references) whose transformer has zero_cond_t (2511's
timestep 0 for the reference tokens), with tiny:qwen_image_edit's parts (../tiny.py).

Why a package with a weights.safetensors: a family registers extra tiny names through
`trained_tiny` (core/models/base.py), whose machinery (core/models/tiny/materialize.py)
imports this package's `build` and hashes the weights.safetensors beside it into the
built folder's marker, so a changed file rebuilds every workspace's copy. This model is
random, so the committed file holds no tensors: its metadata is the recipe (`RECIPE`),
which `build` reads; `write_recipe()` writes it (as wan/tiny22/ does).
"""

from __future__ import annotations

from pathlib import Path

WEIGHTS = Path(__file__).with_name("weights.safetensors")
RECIPE = {"pipeline": "QwenImageEditPlusPipeline", "zero_cond_t": "true"}


def write_recipe(path: Path = WEIGHTS) -> None:
    """The tensor-less weights.safetensors whose metadata is RECIPE."""
    from safetensors.torch import save_file

    save_file({}, str(path), metadata=dict(RECIPE))


def read_recipe(path: Path = WEIGHTS) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def build(out_dir: Path, seed: int = 0) -> None:
    """Write tiny:qwen_image_edit_plus as a diffusers folder."""
    from core.models.families.qwen_image_edit.tiny import build_pipeline

    recipe = read_recipe()
    build_pipeline(out_dir, seed, recipe["pipeline"], zero_cond_t=recipe["zero_cond_t"] == "true")

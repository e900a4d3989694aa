"""`tiny:wan22`: a tiny random Wan 2.2 A14B-shaped text-to-video model. Two one-block
experts (`transformer`, the high-noise one, and `transformer_2`, the low-noise one, drawn
from different seeds) split at boundary_ratio 0.875 as Wan2.2-T2V-A14B's model_index.json
says, with tiny:wan's VAE, UMT5 encoder, tokenizer and scheduler (../tiny.py).

Why a package with a weights.safetensors: a family registers extra tiny names through
`trained_tiny` (core/models/base.py), whose machinery (core/models/tiny/materialize.py)
imports this package's `build` and hashes the weights.safetensors beside it into the built
folder's marker, so a changed file rebuilds every workspace's copy. This model is random,
so the committed file holds no tensors: its metadata is the recipe (`RECIPE`: the second
expert's seed offset and the boundary), which `build` reads. `write_recipe()` writes it.
"""

from __future__ import annotations

from pathlib import Path

WEIGHTS = Path(__file__).with_name("weights.safetensors")
# The A14B T2V model_index.json's boundary_ratio; the low-noise expert's seed is the
# build seed plus the offset (tiny:wan's parts use seed .. seed + 2).
RECIPE = {"boundary_ratio": "0.875", "second_seed_offset": "3"}


def write_recipe(path: Path = WEIGHTS) -> None:
    """The tensor-less weights.safetensors whose metadata is RECIPE."""
    from core.models.tiny.recipe import write_recipe as write

    write(path, RECIPE)


def build(out_dir: Path, seed: int = 0) -> None:
    """Write tiny:wan22 as a diffusers folder (WanPipeline with transformer_2)."""
    from core.models.families.wan.tiny import build_pipeline
    from core.models.tiny.recipe import read_recipe

    recipe = read_recipe(WEIGHTS)
    build_pipeline(out_dir, seed, second_seed=seed + int(recipe["second_seed_offset"]),
                   boundary_ratio=float(recipe["boundary_ratio"]))

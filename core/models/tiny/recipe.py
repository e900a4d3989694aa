"""The recipe file of a random `trained_tiny` model (wan's tiny22/, tiny_i2v/, tiny_ti2v/,
qwen_image_edit's tiny_plus/).

A family registers extra tiny names through `trained_tiny` (core/models/base.py); the
tiny machinery (materialize.py) imports the named package's `build` and hashes the
weights.safetensors beside it into the built folder's marker, so a changed file rebuilds
every workspace's copy. A random model's file holds no tensors: its metadata is the
recipe its `build` reads.
"""

from __future__ import annotations

from pathlib import Path


def write_recipe(path: Path, recipe: dict[str, str]) -> None:
    """The tensor-less weights.safetensors at `path` whose metadata is `recipe`."""
    from safetensors.torch import save_file

    save_file({}, str(path), metadata=dict(recipe))


def read_recipe(path: Path) -> dict[str, str]:
    """The recipe `write_recipe` wrote to `path`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})

"""Tiny models for every family, built offline from configs: the demo's model and
the tests'. The families (core/models/families/<family>/family.py) load them like any
diffusers folder.

- materialize.py: `resolve_model_path("tiny:sd15", workspace)` builds a workspace's
  tiny model once (atomically, under a lock) and returns its folder.
- core/models/families/<family>/tiny.py: `build(out_dir, seed)`, one per family, found by
  `tiny_builder(family)`.
- shapes/: `tiny:sd15-shapes`, the demo's base: the tiny SD1.5 with trained weights
  (weights.safetensors, made by shapes/pretrain.py), so the demo shows what it learned.
- clip.py, t5.py, vae.py: the small text encoders, tokenizers and VAEs they share.

Importing this package stays cheap (no torch): `--stage check` and the cache status use
`tiny_dir` and `MARKER`.
"""

from core.models.tiny.materialize import (
    MARKER,
    TINY_PREFIX,
    TINY_SEED,
    TINY_VERSION,
    build_tiny_folder,
    materialize_tiny,
    resolve_model_path,
    tiny_builder,
    tiny_dir,
    tiny_family,
    tiny_is_built,
    tiny_names,
    trained_tiny,
)

__all__ = ["MARKER", "TINY_PREFIX", "TINY_SEED", "TINY_VERSION",
           "build_tiny_folder", "materialize_tiny", "resolve_model_path", "tiny_builder",
           "tiny_dir", "tiny_family", "tiny_is_built", "tiny_names",
           "trained_tiny"]

"""Ideogram 4's transformer file in ComfyUI's layout (`model.diffusion_model.` + the
original names), under the diffusers model's names: diffusers 0.42.1 has no converter for
it (Ideogram4Transformer2DModel is not among from_single_file's classes), so the family
maps it. Facts from ComfyUI 0.29.0 comfy/ldm/ideogram4/model.py: each block's attention
holds q, k and v as one `attention.qkv` Linear (its output viewed as (3, heads,
head_dim): q's rows, then k's, then v's) and its output as `attention.o`; every other
name is diffusers' own. Both models rotate q and k in the split-half convention, so no
row is permuted."""

from __future__ import annotations

from typing import Any

QKV, OUT = ".attention.qkv.", ".attention.o."


def diffusers_names(state: dict[str, Any]) -> dict[str, Any]:
    """The file's tensors (prefix already off) under Ideogram4Transformer2DModel's names."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if QKV in key:
            stem, param = key.split(QKV)
            for name, part in zip(("to_q", "to_k", "to_v"), value.chunk(3), strict=True):
                out[f"{stem}.attention.{name}.{param}"] = part
        else:
            out[key.replace(OUT, ".attention.to_out.0.")] = value
    return out

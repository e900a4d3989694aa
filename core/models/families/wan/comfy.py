"""Wan's LoRA in ComfyUI's file: diffusers' module names inside the transformer's blocks
written as Wan's original ones under "diffusion_model." (family.py's docstring says how
ComfyUI maps them; core/models/comfyui_names.py renames by ORIGINAL_NAMES); out of
family.py to keep that module under 400 lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.comfyui_names import ModuleNames

# diffusers module (inside blocks.N) -> Wan's original name, as ComfyUI's Wan model and
# the original checkpoints name it.
ORIGINAL_NAMES = ModuleNames(blocks={"blocks": ("blocks", {
    "attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v",
    "attn1.to_out.0": "self_attn.o", "attn2.to_q": "cross_attn.q",
    "attn2.to_k": "cross_attn.k", "attn2.to_v": "cross_attn.v",
    "attn2.to_out.0": "cross_attn.o", "attn2.add_k_proj": "cross_attn.k_img",
    "attn2.add_v_proj": "cross_attn.v_img", "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2"})})


def save_comfy(module: Any, peft_sd: dict[str, Any], config: Any, path: Path) -> Path | None:
    """The ComfyUI file of one Wan transformer's adapter: Wan's original names under
    "diffusion_model." (see family.py's docstring)."""
    from core.models.comfyui_names import save_named_comfy

    return save_named_comfy(module, peft_sd, config, path, ORIGINAL_NAMES)

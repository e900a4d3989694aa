"""Wan's LoRA in ComfyUI's file: diffusers' module names inside the transformer's blocks
written as Wan's original ones under "diffusion_model." (family.py's docstring says how
ComfyUI maps them); out of family.py to keep that module under 400 lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# diffusers module (inside blocks.N) -> Wan's original name, as ComfyUI and the
# original checkpoints name it.
ORIGINAL_NAMES = {"attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k",
                  "attn1.to_v": "self_attn.v", "attn1.to_out.0": "self_attn.o",
                  "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k",
                  "attn2.to_v": "cross_attn.v", "attn2.to_out.0": "cross_attn.o",
                  "attn2.add_k_proj": "cross_attn.k_img", "attn2.add_v_proj": "cross_attn.v_img",
                  "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2"}


def original_module_name(module: str) -> str | None:
    """Wan's original name of a diffusers module of the transformer ("blocks.3.attn1.to_q"
    -> "blocks.3.self_attn.q"); None for one it has no LoRA name for."""
    head, _, rest = module.partition(".")
    index, _, leaf = rest.partition(".")
    if head == "blocks" and index.isdigit() and leaf in ORIGINAL_NAMES:
        return f"blocks.{index}.{ORIGINAL_NAMES[leaf]}"
    return None


def save_comfy(module: Any, peft_sd: dict[str, Any], config: Any, path: Path) -> Path | None:
    """The ComfyUI file of one Wan transformer's adapter: Wan's original names under
    "diffusion_model." (see the module docstring); a module without one (an unusual
    target) keeps diffusers' "transformer." names, as the other families write."""
    from core.models.lora_files import base_weights, lora_modules, save_comfy_lora

    if any(original_module_name(m) is None for m in lora_modules(peft_sd)):
        return save_comfy_lora(peft_sd, config, path, base_weights(module))
    return save_comfy_lora(peft_sd, config, path, base_weights(module),
                           prefix="diffusion_model.", rename=original_module_name)

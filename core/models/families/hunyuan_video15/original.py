"""HunyuanVideo 1.5's transformer file in its original layout (Tencent's names, which
ComfyUI's diffusion-model file keeps, after `model.diffusion_model.` or none), under
HunyuanVideo15Transformer3DModel's names: diffusers 0.42.1 has no converter for it (the
class is not among from_single_file's), so the family maps it.

Facts (no code taken): diffusers' scripts/convert_hunyuan_video1_5_to_diffusers.py (the
whole-model table, Tencent's release with q, k and v apart in the double blocks) and
ComfyUI's comfy/supported_models.py `HunyuanVideo.process_unet_state_dict`,
comfy/model_detection.py and comfy/ldm/hunyuan_video/model.py (ComfyUI's file holds each
double block's q, k and v as one `img_attn_qkv` / `txt_attn_qkv`, q's rows first, as
FLUX.1's DoubleStreamBlock does; the token refiner's as `self_attn_qkv` in both). The
double blocks' names are the LoRA table's (comfyui_keys.ROWS: ComfyUI's LoRA names are
these weights' names), the rest is listed here. Every part maps to one diffusers tensor,
or a fused one splits into equal parts along its outputs, except the final layer's
modulation, whose (shift, scale) halves diffusers holds as (scale, shift).
"""

from __future__ import annotations

from typing import Any

from core.models.families.hunyuan_video15.comfyui_keys import ROWS

BLOCK, REFINER = "double_blocks.", "txt_in.individual_token_refiner.blocks."
# Leaves of a double block beside the LoRA table's: the q/k norms, and q, k and v apart
# (Tencent's own file).
DOUBLE = {
    **{leaf: modules for leaf, _, modules in ROWS},
    "img_attn_q_norm": ("attn.norm_q",), "img_attn_k_norm": ("attn.norm_k",),
    "txt_attn_q_norm": ("attn.norm_added_q",), "txt_attn_k_norm": ("attn.norm_added_k",),
    "img_attn_q": ("attn.to_q",), "img_attn_k": ("attn.to_k",),
    "img_attn_v": ("attn.to_v",), "txt_attn_q": ("attn.add_q_proj",),
    "txt_attn_k": ("attn.add_k_proj",), "txt_attn_v": ("attn.add_v_proj",),
}
# Leaves of a token-refiner block.
REFINE = {
    "norm1": ("norm1",), "norm2": ("norm2",),
    "self_attn_qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "self_attn_proj": ("attn.to_out.0",), "mlp.fc1": ("ff.net.0.proj",),
    "mlp.fc2": ("ff.net.2",), "adaLN_modulation.1": ("norm_out.linear",),
}
CONTEXT = "context_embedder."
# Modules outside the blocks.
TOP = {
    "img_in.proj": "x_embedder.proj",
    "time_in.mlp.0": "time_embed.timestep_embedder.linear_1",
    "time_in.mlp.2": "time_embed.timestep_embedder.linear_2",
    "txt_in.input_embedder": CONTEXT + "proj_in",
    "txt_in.t_embedder.mlp.0": CONTEXT + "time_text_embed.timestep_embedder.linear_1",
    "txt_in.t_embedder.mlp.2": CONTEXT + "time_text_embed.timestep_embedder.linear_2",
    "txt_in.c_embedder.linear_1": CONTEXT + "time_text_embed.text_embedder.linear_1",
    "txt_in.c_embedder.linear_2": CONTEXT + "time_text_embed.text_embedder.linear_2",
    "byt5_in.layernorm": "context_embedder_2.norm",
    "byt5_in.fc1": "context_embedder_2.linear_1",
    "byt5_in.fc2": "context_embedder_2.linear_2",
    "byt5_in.fc3": "context_embedder_2.linear_3",
    "vision_in.proj.0": "image_embedder.norm_in",
    "vision_in.proj.1": "image_embedder.linear_1",
    "vision_in.proj.3": "image_embedder.linear_2",
    "vision_in.proj.4": "image_embedder.norm_out",
    "cond_type_embedding": "cond_type_embed",
    "final_layer.linear": "proj_out",
    "final_layer.adaLN_modulation.1": "norm_out.linear",
}
SWAPPED = "final_layer.adaLN_modulation.1"  # (shift, scale) -> diffusers' (scale, shift)


def _modules(module: str) -> tuple[str, ...] | None:
    """The diffusers modules an original module's tensors go to, in output order."""
    if module in TOP:
        return (TOP[module],)
    for head, leaves, to_head in ((BLOCK, DOUBLE, "transformer_blocks."),
                                  (REFINER, REFINE, CONTEXT + "token_refiner.refiner_blocks.")):
        index, _, leaf = module.removeprefix(head).partition(".")
        if module.startswith(head) and index.isdigit() and leaf in leaves:
            return tuple(f"{to_head}{index}.{m}" for m in leaves[leaf])
    return None


def diffusers_names(state: dict[str, Any]) -> dict[str, Any]:
    """The file's tensors (prefix already off) under HunyuanVideo15Transformer3DModel's
    names. A tensor without a name here keeps its own, so the strict load names it."""
    import torch

    out: dict[str, Any] = {}
    for key, value in state.items():
        module, _, param = key.rpartition(".")
        modules = _modules(module)
        if modules is None:
            out[key] = value
            continue
        if module == SWAPPED:
            shift, scale = value.chunk(2)
            value = torch.cat([scale, shift])
        for name, part in zip(modules, value.chunk(len(modules)), strict=True):
            out[f"{name}.{param}"] = part
    return out

"""FLUX.2 LoRA for ComfyUI: BFL's own module names ("diffusion_model.double_blocks.0.
img_attn.qkv.lora_A.weight"), the layout ai-toolkit writes and ComfyUI reads for FLUX.2.

Why BFL names for plain LoRA: every key "diffusion_model.<weight>" of the model is a
LoRA key in ComfyUI's generic map (comfy/lora.py model_lora_keys_unet), so BFL names load
in any ComfyUI with FLUX.2, and diffusers reads the same file (Flux2LoraLoaderMixin's
_convert_non_diffusers_flux2_lora_to_diffusers), which the tests use to check it. The
"transformer.<diffusers name>" keys go through ComfyUI's Flux table (comfy/utils.py
flux_to_diffusers; ComfyUI's Flux2 model subclasses Flux), which ComfyUI 0.29.0 extends
with FLUX.2's ff.linear_in/linear_out, single blocks' attn.to_qkv_mlp_proj and
attn.to_out (added there for LyCORIS LoKr files; an older ComfyUI may drop those keys).

The fused projections: BFL's double blocks hold q, k, v in one `qkv` Linear, so the three
LoRAs are written as one (core/models/comfyui_names.py: down stacked, up block-diagonal,
each module's alpha/r folded into up and no `.alpha`).

Plain LoRA only: a DoRA, LoKr or LoHa update of q, k and v is no single update of that
kind on the fused qkv, so those kinds are written with diffusers' names
(Flux2Family._save_comfy: lora_files.save_comfy_lora), which ComfyUI applies to q, k and v
as slices of qkv (flux_to_diffusers' offsets); `save_bfl_lora` returns None for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.comfyui_names import Fused, ModuleNames, fused_tensors
from core.models.lora_files import _write

# diffusers module -> BFL module: inside transformer_blocks.N (double_blocks.N), inside
# single_transformer_blocks.N (single_blocks.N), and outside the blocks.
DOUBLE = {"attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
          "ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2",
          "ff_context.linear_in": "txt_mlp.0", "ff_context.linear_out": "txt_mlp.2"}
SINGLE = {"attn.to_qkv_mlp_proj": "linear1", "attn.to_out": "linear2"}
TOP = {"x_embedder": "img_in", "context_embedder": "txt_in", "proj_out": "final_layer.linear"}
BFL_NAMES = ModuleNames(blocks={"transformer_blocks": ("double_blocks", DOUBLE),
                                "single_transformer_blocks": ("single_blocks", SINGLE)},
                        top=TOP)
FUSED = (Fused("transformer_blocks", "img_attn.qkv", ("attn.to_q", "attn.to_k", "attn.to_v")),
         Fused("transformer_blocks", "txt_attn.qkv",
               ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")))


def save_bfl_lora(peft_sd: dict[str, Any], config: Any, path: Path) -> Path | None:
    """Write the BFL-layout file; None (nothing written) when it cannot be expressed (not
    plain LoRA, or a module BFL_NAMES does not name)."""
    tensors = fused_tensors(peft_sd, config, BFL_NAMES, FUSED)
    if tensors is None:
        return None
    return _write(tensors, Path(path), config, {})

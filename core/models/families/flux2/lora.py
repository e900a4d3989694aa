"""FLUX.2 LoRA for ComfyUI: BFL's own module names ("diffusion_model.double_blocks.0.
img_attn.qkv.lora_A.weight"), the layout ai-toolkit writes and ComfyUI reads for FLUX.2.

Why BFL names for plain LoRA: every key "diffusion_model.<weight>" of the model is a
LoRA key in ComfyUI's generic map (comfy/lora.py model_lora_keys_unet), so BFL names load
in any ComfyUI with FLUX.2, and diffusers reads the same file (Flux2LoraLoaderMixin's
_convert_non_diffusers_flux2_lora_to_diffusers), which the tests use to check it. The
"transformer.<diffusers name>" keys go through ComfyUI's Flux table (comfy/utils.py
flux_to_diffusers; ComfyUI's Flux2 model subclasses Flux), which only newer ComfyUI
extends with FLUX.2's ff.linear_in/linear_out, single blocks' attn.to_qkv_mlp_proj and
attn.to_out (added there for LyCORIS LoKr files).

The fused projections: BFL's double blocks hold q, k, v in one `qkv` Linear. The three
LoRAs become one of rank 3r whose A stacks Aq, Ak, Av and whose B is block-diagonal,
so B A = [Bq Aq; Bk Ak; Bv Av] exactly (diffusers splits such a file back by chunking B
in three along its outputs and sharing A). Each module's PEFT scale alpha/r is folded
into B and no `.alpha` is written, so readers apply scale 1 whatever rank they see.

Plain LoRA only: a DoRA, LoKr or LoHa update of q, k and v is no single update of that
kind on the fused qkv (a Kronecker or Hadamard product does not stack, and DoRA's
magnitudes are per module), so those kinds are written with diffusers' names
(Flux2Family._save_comfy: lora_files.save_comfy_lora), which ComfyUI applies to q, k and v
as slices of qkv (flux_to_diffusers' offsets); bfl_tensors returns None for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.models.lora_files import _write, lora_modules, module_alpha

PREFIX = "diffusion_model."
# diffusers module (under transformer_blocks.N.) -> BFL module (under double_blocks.N.)
DOUBLE = {"attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
          "ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2",
          "ff_context.linear_in": "txt_mlp.0", "ff_context.linear_out": "txt_mlp.2"}
FUSED = {"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
         "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")}
SINGLE = {"attn.to_qkv_mlp_proj": "linear1", "attn.to_out": "linear2"}
TOP = {"x_embedder": "img_in", "context_embedder": "txt_in", "proj_out": "final_layer.linear"}


def bfl_name(module: str) -> str | None:
    """The BFL name of an unfused diffusers module; None for fused parts or unknown ones."""
    if module in TOP:
        return TOP[module]
    head, _, rest = module.partition(".")
    index, _, leaf = rest.partition(".")
    if head == "transformer_blocks" and leaf in DOUBLE:
        return f"double_blocks.{index}.{DOUBLE[leaf]}"
    if head == "single_transformer_blocks" and leaf in SINGLE:
        return f"single_blocks.{index}.{SINGLE[leaf]}"
    return None


def bfl_tensors(peft_sd: dict[str, Any], config: Any) -> dict[str, Any] | None:
    """{BFL key: tensor} with scales folded in; None when the adapter is not plain LoRA
    or holds a module with no BFL name."""
    import torch

    modules = lora_modules(peft_sd)
    if any(set(w) != {"lora_A.weight", "lora_B.weight"} for w in modules.values()):
        return None

    def scaled(module: str) -> tuple[Any, Any]:
        w = modules.pop(module)
        scale = module_alpha(config, module) / w["lora_A.weight"].shape[0]
        return w["lora_A.weight"], w["lora_B.weight"] * scale

    out: dict[str, Any] = {}
    blocks = {m.split(".")[1] for m in modules if m.startswith("transformer_blocks.")}
    for index in sorted(blocks, key=int):
        for fused, parts in FUSED.items():
            names = [f"transformer_blocks.{index}.{p}" for p in parts]
            present = [n in modules for n in names]
            if not any(present):
                continue
            if not all(present):
                return None  # a fused Linear needs all three parts' LoRAs
            pairs = [scaled(n) for n in names]
            key = f"{PREFIX}double_blocks.{index}.{fused}"
            out[f"{key}.lora_A.weight"] = torch.cat([a for a, _ in pairs])
            out[f"{key}.lora_B.weight"] = torch.block_diag(*[b for _, b in pairs])
    for module in list(modules):
        name = bfl_name(module)
        if name is None:
            return None
        a, b = scaled(module)
        out[f"{PREFIX}{name}.lora_A.weight"] = a
        out[f"{PREFIX}{name}.lora_B.weight"] = b
    return out


def save_bfl_lora(peft_sd: dict[str, Any], config: Any, path: Path) -> Path | None:
    """Write the BFL-layout file; None (nothing written) when it cannot be expressed."""
    tensors = bfl_tensors(peft_sd, config)
    if tensors is None:
        return None
    return _write(tensors, Path(path), config, {})

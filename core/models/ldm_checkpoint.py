"""Diffusers folders written as original-layout (LDM: A1111/ComfyUI) single-file
checkpoints, the way people download them: one .safetensors holding the UNet
(`model.diffusion_model.`), the VAE (`first_stage_model.`) and the text encoders
(`cond_stage_model.` for SD1/SD2, `conditioner.embedders.N.` for SDXL): what `--stage
merge` writes beside merged/ as merged.safetensors for a family with a
`single_file.checkpoint_text_encoders` layout, and what the tests build single files from.

The key mapping is the standard one of diffusers' scripts/convert_diffusers_to_original_
stable_diffusion.py and convert_diffusers_to_original_sdxl.py. Those scripts hardcode the
real models' block counts; here the counts come from the folder's configs, so the tiny
models (two UNet levels, one VAE resnet per level) convert too. Prefixes are matched at
the start of a key, never replaced inside it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# (diffusers, original) for whole keys at the UNet's top level; the add_embedding is SDXL's.
UNET_TOP = [("time_embedding.linear_1.", "time_embed.0."), ("time_embedding.linear_2.",
            "time_embed.2."), ("conv_in.", "input_blocks.0.0."), ("conv_norm_out.", "out.0."),
            ("conv_out.", "out.2."), ("add_embedding.linear_1.", "label_emb.0.0."),
            ("add_embedding.linear_2.", "label_emb.0.2.")]
UNET_RESNET = [("norm1.", "in_layers.0."), ("conv1.", "in_layers.2."), ("norm2.", "out_layers.0."),
               ("conv2.", "out_layers.3."), ("time_emb_proj.", "emb_layers.1."),
               ("conv_shortcut.", "skip_connection.")]
VAE_ATTENTION = [("group_norm.", "norm."), ("to_q.", "q."), ("to_k.", "k."), ("to_v.", "v."),
                 ("to_out.0.", "proj_out.")]
OPEN_CLIP = [("text_model.encoder.layers.", "transformer.resblocks."), ("layer_norm1", "ln_1"),
             ("layer_norm2", "ln_2"), (".mlp.fc1.", ".mlp.c_fc."), (".mlp.fc2.", ".mlp.c_proj."),
             (".self_attn.", ".attn."), ("text_model.final_layer_norm.", "ln_final."),
             ("text_model.embeddings.token_embedding.weight", "token_embedding.weight"),
             ("text_model.embeddings.position_embedding.weight", "positional_embedding")]


def _rename(key: str, prefixes: list[tuple[str, str]]) -> tuple[str, str] | None:
    """(original prefix, rest of the key) for the first diffusers prefix `key` starts with."""
    for hf, sd in prefixes:
        if key.startswith(hf):
            return sd, key[len(hf):]
    return None


def _replace_parts(rest: str, parts: list[tuple[str, str]]) -> str:
    for hf, sd in parts:
        rest = rest.replace(hf, sd)
    return rest


def unet_prefixes(config: dict[str, Any], keys: list[str]) -> list[tuple[str, str]]:
    """(diffusers, original) block prefixes: input_blocks hold each level's resnets (.0)
    and attentions (.1) then its downsampler; output_blocks hold layers_per_block + 1
    resnets per level, the upsampler after the attention when the level has one."""
    levels, per = len(config["block_out_channels"]), config["layers_per_block"]
    out = [("mid_block.resnets.0.", "middle_block.0."), ("mid_block.attentions.0.",
           "middle_block.1."), ("mid_block.resnets.1.", "middle_block.2.")]
    for i in range(levels):
        for j in range(per):
            n = (per + 1) * i + j + 1
            out += [(f"down_blocks.{i}.resnets.{j}.", f"input_blocks.{n}.0."),
                    (f"down_blocks.{i}.attentions.{j}.", f"input_blocks.{n}.1.")]
        for j in range(per + 1):
            n = (per + 1) * i + j
            out += [(f"up_blocks.{i}.resnets.{j}.", f"output_blocks.{n}.0."),
                    (f"up_blocks.{i}.attentions.{j}.", f"output_blocks.{n}.1.")]
        if i < levels - 1:
            attn = any(k.startswith(f"up_blocks.{i}.attentions.") for k in keys)
            out += [(f"down_blocks.{i}.downsamplers.0.conv.",
                     f"input_blocks.{(per + 1) * (i + 1)}.0.op."),
                    (f"up_blocks.{i}.upsamplers.0.",
                     f"output_blocks.{(per + 1) * i + per}.{2 if attn else 1}.")]
    return out


def unet_to_ldm(state: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    blocks = unet_prefixes(config, list(state))
    out = {}
    for key, value in state.items():
        top = _rename(key, UNET_TOP)
        if top is not None:
            out["".join(top)] = value
            continue
        found = _rename(key, blocks)
        if found is None:
            raise ValueError(f"no original name for UNet key {key}")
        sd, rest = found
        if ".resnets." in key:
            rest = _replace_parts(rest, UNET_RESNET)
        out[sd + rest] = value
    return out


def vae_prefixes(config: dict[str, Any]) -> list[tuple[str, str]]:
    """Encoder levels keep their order; decoder levels are numbered in reverse."""
    levels, per = len(config["block_out_channels"]), config["layers_per_block"]
    out = []
    for part in ("encoder", "decoder"):
        out += [(f"{part}.mid_block.resnets.0.", f"{part}.mid.block_1."),
                (f"{part}.mid_block.resnets.1.", f"{part}.mid.block_2."),
                (f"{part}.mid_block.attentions.0.", f"{part}.mid.attn_1."),
                (f"{part}.conv_norm_out.", f"{part}.norm_out.")]
    for i in range(levels):
        up = levels - 1 - i
        out += [(f"encoder.down_blocks.{i}.resnets.{j}.", f"encoder.down.{i}.block.{j}.")
                for j in range(per)]
        out += [(f"decoder.up_blocks.{i}.resnets.{j}.", f"decoder.up.{up}.block.{j}.")
                for j in range(per + 1)]
        if i < levels - 1:
            out += [(f"encoder.down_blocks.{i}.downsamplers.0.", f"encoder.down.{i}.downsample."),
                    (f"decoder.up_blocks.{i}.upsamplers.0.", f"decoder.up.{up}.upsample.")]
    return out


def vae_to_ldm(state: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Attention projections become 1x1 convolutions, as in the original VAE."""
    blocks = vae_prefixes(config)
    out = {}
    for key, value in state.items():
        found = _rename(key, blocks)
        if found is None:  # conv_in, conv_out, quant_conv, post_quant_conv keep their names
            out[key] = value
            continue
        sd, rest = found
        if ".resnets." in key:
            rest = rest.replace("conv_shortcut.", "nin_shortcut.")
        if ".attentions." in key:
            rest = _replace_parts(rest, VAE_ATTENTION)
            if value.ndim == 2:
                value = value.reshape(*value.shape, 1, 1)
        out[sd + rest] = value
    return out


def _hf_clip_keys(state: dict[str, Any]) -> dict[str, Any]:
    """transformers >= 5.6 saves CLIPTextModel without its `text_model.` level; originals
    (and the mappings) have it."""
    return {k if k.startswith(("text_model.", "text_projection")) else f"text_model.{k}": v
            for k, v in state.items()}


def clip_to_ldm(state: dict[str, Any]) -> dict[str, Any]:
    """OpenAI CLIP (SD1's, SDXL's first encoder): the transformers names themselves."""
    return _hf_clip_keys(state)


def open_clip_to_ldm(state: dict[str, Any]) -> dict[str, Any]:
    """OpenCLIP (SD2's, SDXL's second encoder): fused q/k/v `in_proj`, OpenCLIP names and
    the projection stored transposed."""
    import torch

    state = _hf_clip_keys(state)
    out: dict[str, Any] = {}
    fused: dict[str, dict[str, Any]] = {}
    for key, value in state.items():
        qkv = re.match(r"(.+\.self_attn)\.([qkv])_proj\.(weight|bias)$", key)
        if qkv:
            prefix, code, kind = qkv.groups()
            fused.setdefault(f"{prefix}.in_proj_{kind}", {})[code] = value
        elif key == "text_projection.weight":
            out["text_projection"] = value.T.contiguous()
        else:
            out[_replace_parts(key, OPEN_CLIP)] = value
    for key, parts in fused.items():
        out[_replace_parts(key, OPEN_CLIP)] = torch.cat([parts[c] for c in "qkv"])
    return out


def _component(folder: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state dict, config) of one component folder (every shard of its weights)."""
    from safetensors.torch import load_file

    sub = folder / name
    state: dict[str, Any] = {}
    for weights in sorted(sub.glob("*.safetensors")):
        state.update(load_file(str(weights)))
    return state, json.loads((sub / "config.json").read_text())


# Each kind of text encoder: its original names.
TEXT_ENCODER_KINDS = {"clip": lambda state: clip_to_ldm(state),
                      "open_clip": lambda state: open_clip_to_ldm(state)}


def ldm_state_dict(folder: Path, text_encoders: tuple[tuple[str, str, str], ...]
                   ) -> dict[str, Any]:
    """Every weight of a diffusers UNet folder (sd15/sd2/sdxl) under its original name;
    `text_encoders`: the family's (component folder, key prefix, kind) per text encoder
    (its `single_file.checkpoint_text_encoders`)."""
    unet, unet_config = _component(folder, "unet")
    vae, vae_config = _component(folder, "vae")
    out = {f"model.diffusion_model.{k}": v for k, v in unet_to_ldm(unet, unet_config).items()}
    out.update({f"first_stage_model.{k}": v for k, v in vae_to_ldm(vae, vae_config).items()})
    for name, prefix, kind in text_encoders:
        state, _ = _component(folder, name)
        out.update({f"{prefix}{k}": v for k, v in TEXT_ENCODER_KINDS[kind](state).items()})
    return out


def write_single_file(folder: Path, text_encoders: tuple[tuple[str, str, str], ...],
                      out: Path, dtype: Any = None) -> Path:
    """The folder as one .safetensors in the original layout (`dtype`: each tensor cast
    to it, None keeps the folder's), written under a temp name and renamed."""
    from safetensors.torch import save_file

    from core.files import atomic_path

    state = {k: (v if dtype is None else v.to(dtype)).contiguous()
             for k, v in ldm_state_dict(folder, text_encoders).items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, temp=f".tmp-{out.name}") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    return out

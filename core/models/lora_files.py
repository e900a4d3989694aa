"""LoRA files: the trained adapter out of the denoiser, written for diffusers and for the
UIs people load LoRAs in.

- diffusers: pytorch_lora_weights.safetensors through the pipeline class's own
  `save_lora_weights`, with the LoRA config as metadata so alpha != rank reloads with the
  right scale (`load_lora_weights`).
- kohya (A1111/ComfyUI for the UNet families): lora_unet_... names, lora_down/lora_up and
  one `.alpha` per module.
- ComfyUI (SD3/Flux): diffusers-style "transformer.<module>" names, lora_A/lora_B and one
  `.alpha` per module.

Both `.alpha` writers use one rule, `module_alpha`: the alpha PEFT gave the module when it
built the adapter (lora_alpha, or the alpha_pattern entry PEFT matched), because a reader
scales each module by alpha / rank and any other alpha changes the trained model.
Files are written to a temporary name and renamed, so a crash never leaves half a file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.models.modules import unwrap
from core.runs.folder import LORA_WEIGHTS_NAME as DIFFUSERS_FILE  # the run-folder contract


def adapter_weights(model: Any, adapter_name: str = "default") -> tuple[dict[str, Any], Any]:
    """The model's LoRA weights as a PEFT state dict (keys ...lora_A.weight) and the
    adapter's LoraConfig."""
    from peft.utils import get_peft_model_state_dict

    model = unwrap(model)
    if not getattr(model, "peft_config", None):
        raise ValueError("the denoiser has no LoRA adapter: add one with "
                         "add_adapter(LoraConfig(...)) before saving a LoRA")
    # No LoRA here targets embeddings: "auto" would look for the base model's config to
    # decide, and warn when it is not on the hub.
    weights = get_peft_model_state_dict(model, adapter_name=adapter_name,
                                        save_embedding_layers=False)
    return weights, model.peft_config[adapter_name]


def module_alpha(config: Any, module: str) -> float:
    """The lora_alpha PEFT used for `module` (its name in the denoiser), matching
    alpha_pattern keys exactly as PEFT does when it creates the layers."""
    from peft.utils.other import get_pattern_key

    patterns = getattr(config, "alpha_pattern", None) or {}
    key = get_pattern_key(patterns.keys(), module)
    return float(patterns.get(key, config.lora_alpha))


def lora_modules(peft_sd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The state dict grouped by module: {module: {"lora_A.weight": A, "lora_B.weight": B}}."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in peft_sd.items():
        module, _, rest = key.partition(".lora_")
        grouped.setdefault(module, {})["lora_" + rest] = value
    return grouped


def has_adapter(model: Any) -> bool:
    """Whether the model (a text encoder, say) carries a LoRA adapter."""
    return bool(getattr(unwrap(model), "peft_config", None))


def save_diffusers_lora(save_fn: Callable[..., Any], layers_kwarg: str, layers: dict[str, Any],
                        config: Any, out_dir: Path, extra: dict[str, Any] | None = None) -> Path:
    """pytorch_lora_weights.safetensors through a pipeline class's `save_lora_weights`.

    layers_kwarg: its argument for the denoiser ("unet_lora_layers" or
    "transformer_lora_layers"); the config travels as the matching
    "..._lora_adapter_metadata". extra: more of its arguments (the text encoders'
    "text_encoder_lora_layers" and their metadata).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_kwarg = layers_kwarg.replace("_lora_layers", "_lora_adapter_metadata")
    save_fn(str(out_dir), **{layers_kwarg: layers, meta_kwarg: config.to_dict()},
            **(extra or {}))
    return out_dir / DIFFUSERS_FILE


def kohya_tensors(peft_sd: dict[str, Any], config: Any, prefix: str) -> dict[str, Any]:
    """kohya/A1111/ComfyUI names (lora_down/lora_up, alpha) for one model's LoRA.

    prefix: "unet" gives lora_unet_..., "text_encoder" lora_te1_..., "text_encoder_2"
    lora_te2_... (diffusers' converter; a single encoder is lora_te_ in kohya's files,
    which the family renames). diffusers' converter writes alpha = rank; each module's
    alpha is replaced by `module_alpha`. Modules convert one at a time so the alpha key
    is the one the converter made for that module.
    """
    import torch
    from diffusers.utils import convert_state_dict_to_kohya

    tensors: dict[str, Any] = {}
    for module, weights in lora_modules(peft_sd).items():
        kohya = convert_state_dict_to_kohya(
            {f"{prefix}.{module}.{name}": value for name, value in weights.items()})
        for key in [k for k in kohya if k.endswith(".alpha")]:
            kohya[key] = torch.tensor(module_alpha(config, module))
        tensors.update(kohya)
    return tensors


def write_kohya(tensors: dict[str, Any], config: Any, path: Path) -> Path:
    """Write kohya tensors (from `kohya_tensors`) as one file."""
    return _write(tensors, path, config, {"ss_network_module": "networks.lora"})


def save_kohya(peft_sd: dict[str, Any], config: Any, path: Path, prefix: str) -> Path:
    """Write one model's LoRA as a kohya/A1111/ComfyUI file (lora_<prefix>_...)."""
    return write_kohya(kohya_tensors(peft_sd, config, prefix), config, path)


def save_comfy_lora(peft_sd: dict[str, Any], config: Any, path: Path) -> Path:
    """Write the LoRA with diffusers-style names ("transformer.<module>.lora_A/B.weight")
    and "transformer.<module>.alpha".

    ComfyUI maps "transformer.<diffusers module>" keys of SD3 and Flux to its own
    weights (comfy/lora.py: mmdit_to_diffusers / flux_to_diffusers) and accepts
    lora_A/lora_B names, scaling each module by alpha / rank (1.0 when alpha is absent),
    so writing alpha makes alpha != rank come out as PEFT trained it.
    """
    import torch

    tensors: dict[str, Any] = {}
    for module, weights in lora_modules(peft_sd).items():
        for name, value in weights.items():
            tensors[f"transformer.{module}.{name}"] = value
        tensors[f"transformer.{module}.alpha"] = torch.tensor(module_alpha(config, module))
    return _write(tensors, path, config, {})


def _write(tensors: dict[str, Any], path: Path, config: Any, metadata: dict[str, str]) -> Path:
    """save_file to a temporary name, then rename; rank and alpha go into the metadata,
    where kohya-style tools show them."""
    from safetensors.torch import save_file

    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    meta = {"format": "pt", **metadata, "ss_network_dim": str(config.r),
            "ss_network_alpha": str(config.lora_alpha)}
    tmp = path.with_name(path.name + ".tmp")
    save_file(cpu, str(tmp), metadata=meta)
    os.replace(tmp, path)
    return path

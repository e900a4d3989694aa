"""LoRA files: the trained adapter out of the denoiser, written for diffusers and for the
UIs people load LoRAs in.

- diffusers: pytorch_lora_weights.safetensors through the pipeline class's own
  `save_lora_weights`, with the LoRA config as metadata so alpha != rank reloads with the
  right scale (`load_lora_weights`). LoRA and DoRA; LoKr for Z-Image and FLUX.2 only
  (adapters.diffusers_kinds: diffusers cannot load the others into these pipelines).
- kohya/LyCORIS (A1111/ComfyUI for the UNet families): lora_unet_... names, lora_down/
  lora_up (+ dora_scale for DoRA), or LyCORIS's lokr_*/hada_*, and one `.alpha` per module.
- ComfyUI (the transformer families): diffusers-style "transformer.<module>" names, lora_A/lora_B
  (+ dora_scale) or lokr_*/hada_*, and one `.alpha` per module.

Both `.alpha` writers use one rule, `module_alpha`: the alpha PEFT gave the module when it
built the adapter (lora_alpha or alpha, or the alpha_pattern entry PEFT matched), because a
reader scales each module by alpha / rank and any other alpha changes the trained model
(adapters.lycoris_module converts what a reader computes differently from peft).
Files are written to a temporary name and renamed, so a crash never leaves half a file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.files import atomic_path
from core.models.adapters import (
    adapter_kind,
    config_alpha,
    lycoris_module,
    network_metadata,
    split_key,
)
from core.models.file_names import LORA_WEIGHTS_NAME as DIFFUSERS_FILE  # run-folder contract
from core.models.modules import unwrap


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
    """The alpha PEFT used for `module` (its name in the denoiser), matching
    alpha_pattern keys exactly as PEFT does when it creates the layers."""
    from peft.utils.other import get_pattern_key

    patterns = getattr(config, "alpha_pattern", None) or {}
    key = get_pattern_key(patterns.keys(), module)
    return float(patterns.get(key, config_alpha(config)))


def module_rank(config: Any, module: str) -> int:
    """The rank PEFT used for `module` (rank_pattern, else r)."""
    from peft.utils.other import get_pattern_key

    patterns = getattr(config, "rank_pattern", None) or {}
    key = get_pattern_key(patterns.keys(), module)
    return int(patterns.get(key, config.r))


def lora_modules(peft_sd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The state dict grouped by module: {module: {"lora_A.weight": A, ...}} (or the
    LoKr/LoHa/DoRA parameters, by peft's names)."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in peft_sd.items():
        module, param = split_key(key)
        grouped.setdefault(module, {})[param] = value
    return grouped


BaseWeight = Callable[[str], Any]


def base_weights(model: Any, strip: str = "") -> BaseWeight:
    """`module name -> the frozen weight under its adapter` for `model` (DoRA's saved
    scale needs it). strip: a prefix the saved names carry and the model lacks (CLIP's
    "text_model.", see stable_diffusion._text_model_names)."""
    model = unwrap(model)

    def weight(module: str) -> Any:
        name = module.removeprefix(strip) if strip and not _has(model, module) else module
        layer = model.get_submodule(name)
        return (layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer).weight

    return weight


def _has(model: Any, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


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


# kohya's name for each model's LoRA (diffusers' converter's: a single text encoder is
# lora_te_ in kohya's files, which the family renames).
KOHYA_PREFIXES = {"unet": "lora_unet", "text_encoder": "lora_te1", "text_encoder_2": "lora_te2"}


def kohya_tensors(peft_sd: dict[str, Any], config: Any, prefix: str,
                  base_weight: BaseWeight | None = None) -> dict[str, Any]:
    """kohya/LyCORIS names for one model's adapter: lora_<prefix>_<module with _>.<suffix>
    (lora_down/lora_up, dora_scale, lokr_*, hada_*) and one `.alpha` per module.

    prefix: "unet" gives lora_unet_..., "text_encoder" lora_te1_..., "text_encoder_2"
    lora_te2_... (the names diffusers' convert_state_dict_to_kohya gives LoRA modules).
    Each module's alpha is `module_alpha`; base_weight (`base_weights`) is needed for DoRA.
    """
    return _lycoris_tensors(peft_sd, config, f"{KOHYA_PREFIXES[prefix]}_", "_",
                            ("lora_down.weight", "lora_up.weight"), base_weight)


def _lycoris_tensors(peft_sd: dict[str, Any], config: Any, prefix: str, dot: str,
                     lora_names: tuple[str, str], base_weight: BaseWeight | None,
                     rename: Callable[[str], str] | None = None) -> dict[str, Any]:
    """Every module through adapters.lycoris_module, named prefix + module (or
    `rename(module)`, its dots replaced by `dot`) + "." + suffix."""
    kind = adapter_kind(config)
    tensors: dict[str, Any] = {}
    for module, weights in lora_modules(peft_sd).items():
        base = None if base_weight is None else (lambda m=module: base_weight(m))
        parts = lycoris_module(kind, weights, module_alpha(config, module),
                               module_rank(config, module), base, lora_names)
        name = prefix + (rename(module) if rename else module).replace(".", dot)
        tensors.update({f"{name}.{suffix}": value for suffix, value in parts.items()})
    return tensors


def write_kohya(tensors: dict[str, Any], config: Any, path: Path) -> Path:
    """Write kohya tensors (from `kohya_tensors`) as one file."""
    return _write(tensors, path, config, network_metadata(adapter_kind(config)))


def save_comfy_lora(peft_sd: dict[str, Any], config: Any, path: Path,
                    base_weight: BaseWeight | None = None, prefix: str = "transformer.",
                    rename: Callable[[str], str] | None = None) -> Path:
    """Write the adapter with diffusers-style names, "transformer.<module>.<suffix>":
    lora_A/lora_B (and dora_scale) for LoRA and DoRA, LyCORIS's lokr_*/hada_* for LoKr and
    LoHa, and one "transformer.<module>.alpha".

    ComfyUI maps "transformer.<diffusers module>" keys of SD3, Flux (Chroma and FLUX.2
    too, Flux models there), Z-Image and Qwen-Image to its own weights (comfy/lora.py
    model_lora_keys_unet: mmdit_to_diffusers, flux_to_diffusers, z_image_to_diffusers,
    Qwen-Image's own names; a diffusers to_q/to_k/to_v becomes a slice of a fused qkv
    weight, and each kind's update is applied to that slice) and reads any adapter kind
    (comfy/weight_adapter) under such a name, scaling each module by alpha / rank (1.0
    when alpha is absent), so writing alpha makes alpha != rank come out as PEFT trained it.
    A family whose ComfyUI model takes other names gives `prefix` and `rename` (module
    name -> ComfyUI's; Wan's original names under "diffusion_model.").
    """
    tensors = _lycoris_tensors(peft_sd, config, prefix, ".",
                               ("lora_A.weight", "lora_B.weight"), base_weight, rename)
    return _write(tensors, path, config, {})


def _write(tensors: dict[str, Any], path: Path, config: Any, metadata: dict[str, str]) -> Path:
    """save_file to a temporary name, then rename; rank and alpha go into the metadata,
    where kohya-style tools show them."""
    from safetensors.torch import save_file

    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    meta = {"format": "pt", **metadata, "ss_network_dim": str(config.r),
            "ss_network_alpha": str(config_alpha(config))}
    with atomic_path(path, temp=path.name + ".tmp") as tmp:
        save_file(cpu, str(tmp), metadata=meta)
    return path

"""ComfyUI single files of a denoiser as model.path: bf16, fp8 (float8_e4m3fn) or
"fp8_scaled" weights.

ComfyUI's scaled fp8 files (facts read from ComfyUI's comfy/utils.py convert_old_quants and
comfy/ops.py; no code taken, ComfyUI is GPL) store each quantized Linear's
`<layer>.weight` in float8_e4m3fn beside a float32 `<layer>.scale_weight` (the real
weight is fp8 * scale), sometimes a `<layer>.scale_input`, and one marker tensor
`<prefix>scaled_fp8`; the newer layout names the scales `<layer>.weight_scale` /
`<layer>.input_scale` and adds `<layer>.comfy_quant` (uint8 JSON). Keys carry the prefix
`model.diffusion_model.` or none; diffusers' converters strip it.

Such a file loads de-scaled into the training dtype (`read_transformer`) through the
family's `<transformer>.from_single_file` (or, for a family diffusers has no converter
for, the family's own mapping of the names); a LoRA run then re-quantizes its Linear weights to fp8
on the GPU through model.quantize = "fp8" (`implied_quantize`), so the weights that came
as one byte stay one byte, and the memory estimate counts them so. Everything reading a
header here is torch-free (`--stage check`).
"""

from __future__ import annotations

from typing import Any

FP8_DTYPES = ("F8_E4M3", "F8_E5M2")  # safetensors' names for float8_e4m3fn / e5m2
SCALES = (".scale_weight", ".weight_scale")
# Written beside the weights and not part of the model: input scales (ComfyUI's fp8 matmul
# uses them; a weight-only base does not) and the per-layer quantization metadata.
EXTRAS = (".scale_input", ".input_scale", ".comfy_quant")
MARKER = "scaled_fp8"
PREFIX = "model.diffusion_model."  # the diffusion model's keys in ComfyUI's checkpoints
# Key prefixes of the other components a ComfyUI checkpoint may bundle beside the
# diffusion model (VAE, text encoders, LTX-2's audio VAE and vocoder): read from
# model.config instead when the transformer is read from the file.
COMPONENT_PREFIXES = ("first_stage_model.", "vae.", "cond_stage_model.", "conditioner.",
                      "text_encoders.", "text_encoder.", "audio_vae.", "vocoder.")
# Key fragments of a text encoder's or VAE's own file, and of any denoiser's: a file with
# the first and none of the second is not a base model (checked only when no family's
# markers matched).
TEXT_ENCODER_KEYS = ("embed_tokens.", "token_embedding.", "text_model.", "encoder.block.",
                     "shared.weight")
VAE_KEYS = ("decoder.conv_in.", "decoder.up", "post_quant_conv.", "decoder.head.",
            "decoder.mid")
DENOISER_KEYS = ("diffusion_model.", "transformer_blocks.", "double_blocks.", "adaLN",
                 "modulation", "time_embed", "t_embedder", "timestep")


def fp8_weights(header: dict[str, Any]) -> list[str]:
    """Names of the fp8 weights of a safetensors header (not the marker)."""
    return [k for k, v in header.items() if v.get("dtype") in FP8_DTYPES and not is_marker(k)]


def is_marker(key: str) -> bool:
    return key == MARKER or key.endswith("." + MARKER)


def is_extra(key: str) -> bool:
    """A tensor stored beside the weights that the loaded model does not hold (scales,
    markers, quantization metadata): `load_descaled` drops it, the estimate skips it."""
    return is_marker(key) or key.endswith(SCALES + EXTRAS)


def _scale_of(key: str, header: dict[str, Any]) -> str | None:
    """The scale tensor's name of weight `key` (`<layer>.weight`), or None."""
    layer = key.removesuffix(".weight")
    return next((layer + s for s in SCALES if layer + s in header), None)


def layout(header: dict[str, Any]) -> str:
    """"fp8_scaled", "fp8" or "" (no fp8 weights: bf16, fp16 or fp32)."""
    fp8 = fp8_weights(header)
    if not fp8 and not any(is_marker(k) for k in header):
        return ""
    scaled = any(k.endswith(SCALES) for k in header) or any(is_marker(k) for k in header)
    return "fp8_scaled" if scaled else "fp8"


def layout_problem(header: dict[str, Any]) -> str | None:
    """Why a scaled fp8 file cannot be read (a message to follow the file's path)."""
    if layout(header) != "fp8_scaled":
        return None
    fp8 = fp8_weights(header)
    unscaled = [k for k in fp8 if _scale_of(k, header) is None]
    if unscaled and len(unscaled) == len(fp8):
        return (f"is a scaled fp8 file (it has the `{MARKER}` marker) but holds no "
                f"`scale_weight` for its {len(fp8)} fp8 weights (e.g. {fp8[0]}): without "
                "them the weights are wrong by their scale; re-download the file, or use the "
                "bf16 or plain fp8 one")
    if unscaled:
        return (f"is a scaled fp8 file missing the scales of {len(unscaled)} of its "
                f"{len(fp8)} fp8 weights (e.g. {unscaled[0]}); re-download the file")
    for key in fp8:
        scale = header[_scale_of(key, header) or ""]
        size = 1
        for n in scale.get("shape", ()):
            size *= n
        rows = (header[key].get("shape") or [1])[0]
        if size not in (1, rows):  # per tensor or per output row: block scales are not fp8
            return (f"scales {key} in blocks ({scale.get('shape')}), a layout other than "
                    "fp8_scaled (per-tensor scales); use the bf16 or fp8_scaled file")
    return None


def component_problem(keys: list[str]) -> str | None:
    """Why a file holding only a text encoder or a VAE is not a base model, or None."""
    if any(d in k for d in DENOISER_KEYS for k in keys):
        return None
    for what, fragments in (("a text encoder", TEXT_ENCODER_KEYS), ("a VAE", VAE_KEYS)):
        if any(f in k for f in fragments for k in keys):
            return (f"holds only {what} (no diffusion model keys): model.path takes the "
                    "diffusion model's file; the family's text encoders and VAE come from "
                    "model.config")
    return None


def holds_fp8(path: str) -> bool:
    """Whether model.path is a .safetensors file holding fp8 weights (header only)."""
    from pathlib import Path

    from core.models.source import ModelLoadError, safetensors_header

    if not path.endswith(".safetensors") or not Path(path).is_file():
        return False
    try:
        return bool(layout(safetensors_header(path)))
    except ModelLoadError:  # unreadable: the model.path check says so
        return False


def implied_quantize(path: str, quantize: str, method: str, lora_kind: str = "lora") -> str:
    """model.quantize as a run uses it: "fp8" for a plain LoRA run on a file of fp8
    weights when the config asks for nothing, so those weights stay one byte on the GPU;
    the config's own scheme otherwise (another scheme re-quantizes the de-scaled weights;
    a full fine-tune, and DoRA/LoKr/LoHa, which need an unquantized base, train them
    de-scaled in the training dtype)."""
    if quantize == "none" and method == "lora" and lora_kind == "lora" and holds_fp8(path):
        return "fp8"
    return quantize


def bundles_components(keys: list[str]) -> bool:
    """Whether a checkpoint holds other components beside the diffusion model."""
    return any(k.startswith(COMPONENT_PREFIXES) for k in keys)


def load_descaled(path: str, dtype: Any) -> dict[str, Any]:
    """The diffusion model's tensors of the file, every fp8 weight as fp8 * its scale in
    `dtype` (bf16 when None; plain fp8 weights: cast), the other tensors cast to `dtype`
    when given, scales, markers and input scales dropped, the
    `model.diffusion_model.` prefix taken off (a bundling checkpoint: only those keys):
    a state dict diffusers' converter reads like a bf16 file of the transformer alone.
    Tensors are read one at a time, so the fp8 file is never held twice."""
    import torch
    from safetensors import safe_open

    out: dict[str, Any] = {}
    with safe_open(path, framework="pt") as fh:
        keys = list(fh.keys())
        drop = {k for k in keys if is_extra(k)}
        only_prefixed = bundles_components(keys)
        for key in keys:
            if key in drop or (only_prefixed and not key.startswith(PREFIX)):
                continue
            tensor = fh.get_tensor(key)
            if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                layer = key.removesuffix(".weight")
                scale = next((fh.get_tensor(layer + s) for s in SCALES if layer + s in drop),
                             None)
                tensor = tensor.to(torch.float32)
                if scale is not None:  # per tensor, or one per output row
                    tensor = tensor * scale.to(torch.float32).reshape(
                        -1, *([1] * (tensor.dim() - 1)))
                tensor = tensor.to(dtype or torch.bfloat16)
            elif dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            out[key.removeprefix(PREFIX)] = tensor
    return out


def read_transformer(path: str, dtype: Any) -> dict[str, Any]:
    """The diffusion model's tensors of a single file (`load_descaled`); what was read
    de-scaled or left out is logged."""
    import torch

    from core.models.source import safetensors_header

    header = safetensors_header(path)
    kind = layout(header)
    if kind:
        into = str(dtype or torch.bfloat16).removeprefix("torch.")
        print(f"model.path {path} holds {kind} weights: read de-scaled into {into}; a LoRA "
              "run keeps its Linear weights in fp8 as model.quantize = \"fp8\" unless "
              "model.quantize names another scheme", flush=True)
    if bundles_components(list(header)):
        print(f"model.path {path} bundles a VAE or text encoders: only its diffusion model "
              f"({PREFIX}*) is read; the other components come from model.config", flush=True)
    return load_descaled(path, dtype)

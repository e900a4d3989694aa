"""`train.init_lora`: start training from an existing LoRA file instead of from zero.

Reads the files this tool writes (core/models/lora_files.py) and the usual LoRA layouts:
- diffusers: `unet.<module>.lora.down/up.weight` or `<unet|transformer>.<module>.
  lora_A/lora_B.weight`, alpha from the `lora_adapter_metadata` (alpha = rank without it);
- kohya: `lora_unet_<module with _>.lora_down/lora_up.weight` and `.alpha`;
- ComfyUI (the transformer families): `transformer.<module>.lora_A/lora_B.weight`, `.alpha`.

Modules are matched by their name with dots as underscores (kohya's spelling), so one
rule reads all three. The file must adapt exactly the modules this run's adapter has, at
the same rank; anything else is an `InitLoraError` saying what differs. Each module's B is
rescaled by (file alpha / file rank) / (run alpha / run rank), so the adapter's update
B @ A * scale equals the file's at step 0 even when the two alphas differ. Text-encoder
weights in the file (`text_encoder.`, `lora_te...`) are not loaded (the denoiser's
adapter only); `load_init_lora` reports how many were left.

`lora_file_rank` reads the header only, for `--stage check`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_MODEL_PREFIXES = ("unet.", "transformer.", "lora_unet_")
_TEXT_PREFIXES = ("text_encoder.", "text_encoder_2.", "lora_te_", "lora_te1_", "lora_te2_")
_DOWN = ("lora_A.weight", "lora.down.weight", "lora_down.weight")
_UP = ("lora_B.weight", "lora.up.weight", "lora_up.weight")
_OTHER_KINDS = ("lokr_", "hada_", "dora_scale", "lora_magnitude_vector")


class InitLoraError(ValueError):
    """The file cannot start this run's adapter; the message names the key and the fix."""


def _split(key: str) -> tuple[str, str] | None:
    """(module with underscores, "down"|"up"|"alpha") of a denoiser key; None for a
    text-encoder key or one this reader does not know."""
    if key.startswith(_TEXT_PREFIXES):
        return None
    prefix = next((p for p in _MODEL_PREFIXES if key.startswith(p)), None)
    if prefix is None:
        return None
    rest = key[len(prefix):]
    for names, part in ((_DOWN, "down"), (_UP, "up"), (("alpha",), "alpha")):
        for name in names:
            if rest.endswith("." + name):
                return rest[:-len(name) - 1].replace(".", "_"), part
    return None


def _open(path: str | Path) -> Any:
    from safetensors import safe_open

    if not Path(path).is_file():
        raise InitLoraError(f"train.init_lora: {path} is not a file; give the path of a "
                            ".safetensors LoRA (pytorch_lora_weights.safetensors or "
                            "lora_kohya/lora_comfyui.safetensors)")
    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # safetensors raises several types for a non-file
        raise InitLoraError(f"train.init_lora: {path} is not a readable .safetensors file "
                            f"({exc})") from None


def lora_file_rank(path: str | Path) -> int:
    """The rank of the file's LoRA (the rows of its first down/A matrix), from the header."""
    with _open(path) as handle:
        keys = list(handle.keys())
        other = [k for k in keys if any(s in k for s in _OTHER_KINDS)]
        if other:
            raise InitLoraError(f"train.init_lora: {path} holds a DoRA/LoKr/LoHa adapter "
                                f"({other[0]}); only a plain LoRA can start a run")
        for key in keys:
            split = _split(key)
            if split is not None and split[1] == "down":
                return int(handle.get_slice(key).get_shape()[0])
    raise InitLoraError(f"train.init_lora: {path} has no denoiser LoRA weights this tool "
                        "reads (unet./transformer./lora_unet_ names with lora_A/lora_down)")


def _file_modules(path: str | Path) -> tuple[dict[str, dict[str, Any]], int, dict[str, Any]]:
    """{module: {"down", "up", "alpha"?}}, the number of text-encoder tensors skipped,
    and the diffusers adapter metadata (empty for other files)."""
    modules: dict[str, dict[str, Any]] = {}
    skipped = 0
    with _open(path) as handle:
        meta = json.loads((handle.metadata() or {}).get("lora_adapter_metadata", "{}"))
        for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
            split = _split(key)
            if split is None:
                skipped += key.startswith(_TEXT_PREFIXES)
                continue
            modules.setdefault(split[0], {})[split[1]] = handle.get_tensor(key)
    return modules, skipped, meta


def _metadata_alpha(meta: dict[str, Any]) -> float | None:
    for prefix in ("unet.", "transformer."):
        if f"{prefix}lora_alpha" in meta:
            return float(meta[f"{prefix}lora_alpha"])
    return None


def _differences(model: set[str], file: set[str]) -> str:
    parts = []
    if model - file:
        parts.append(f"{len(model - file)} module(s) of this run's train.lora_targets are "
                     f"not in the file (e.g. {sorted(model - file)[0]})")
    if file - model:
        parts.append(f"the file adapts {len(file - model)} module(s) this run's "
                     f"train.lora_targets do not (e.g. {sorted(file - model)[0]})")
    return "; ".join(parts)


def load_init_lora(denoiser: Any, path: str | Path) -> int:
    """Copy the file's LoRA into the denoiser's adapter (added already, same rank and
    targets). Returns the number of text-encoder tensors left unloaded."""
    import torch

    from core.models.lora_files import adapter_weights, lora_modules, module_alpha, module_rank
    from core.models.modules import unwrap

    model = unwrap(denoiser)
    peft_sd, config = adapter_weights(model)
    own = {m.replace(".", "_"): (m, w) for m, w in lora_modules(peft_sd).items()}
    found, skipped, meta = _file_modules(path)
    if not found:
        raise InitLoraError(f"train.init_lora: {path} has no denoiser LoRA weights this tool "
                            "reads (unet./transformer./lora_unet_ names); for FLUX.2 give "
                            "its pytorch_lora_weights.safetensors")
    if set(own) != set(found):
        raise InitLoraError(f"train.init_lora: {path} does not fit this run's adapter: "
                            + _differences(set(own), set(found)) + "; set train.lora_targets "
                            "(attention or all) to the targets it was trained with")
    file_alpha = _metadata_alpha(meta)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for key, (module, _) in own.items():
            down, up = found[key]["down"], found[key]["up"]
            rank = module_rank(config, module)
            if down.shape[0] != rank:
                raise InitLoraError(f"train.init_lora: {path} has rank {down.shape[0]} but "
                                    f"train.lora_rank is {rank}; set train.lora_rank = "
                                    f"{down.shape[0]}")
            alpha = found[key].get("alpha")
            alpha = float(alpha) if alpha is not None else (file_alpha or float(down.shape[0]))
            scale = (alpha / down.shape[0]) / (module_alpha(config, module) / rank)
            for suffix, value in (("lora_A", down), ("lora_B", up * scale)):
                param = params[f"{module}.{suffix}.default.weight"]
                if tuple(param.shape) != tuple(value.shape):
                    raise InitLoraError(f"train.init_lora: {module}.{suffix} is "
                                        f"{tuple(value.shape)} in {path} but "
                                        f"{tuple(param.shape)} in this model: the file was "
                                        "trained on another architecture")
                param.copy_(value.to(param.device, param.dtype))
    return skipped

"""model.training_adapter (issue 52 item 1): LoRA files fused into the frozen base for
training only, as ai-toolkit's training adapters and musubi-tuner's --base_weights do.

A distilled base (Z-Image Turbo, Krea 2 Turbo, FLUX.2 klein) loses its distillation when
a LoRA trains on it directly; a de-distill adapter fused into the base while training
lets the LoRA learn the concept and not the undoing of the distillation, and the LoRA is
then used on the distilled base without it. So the adapter is added to the denoiser's
weights (W += scale·B·A per module) after loading and before quantization and placement;
the trained adapter sits on top; the run's LoRA holds only what trained, and a merge
loads the base afresh. Validation takes the adapter out (W -= the same product) for its
round unless validation.with_training_adapter, and puts it back after.

The files are read with train.init_lora's reader (core/models/init_lora.py): diffusers,
kohya and this tool's layouts, modules matched by their names with dots as underscores.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KEY = "model.training_adapter"


class TrainingAdapterError(ValueError):
    """A file cannot be fused into this base; the message names it and the module."""


def adapter_modules(path: str | Path) -> dict[str, tuple[Any, Any, float]]:
    """{module with underscores: (down, up, scale)} of a plain LoRA file (scale =
    alpha / rank; alpha = rank where the file gives none)."""
    from core.models.init_lora import InitLoraError, _file_modules, _metadata_alpha, lora_file_rank

    try:
        lora_file_rank(path)  # refuses DoRA/LoKr/LoHa files and files with no LoRA
        found, _, meta = _file_modules(path)
    except InitLoraError as exc:
        raise TrainingAdapterError(str(exc).replace("train.init_lora", KEY)) from None
    default_alpha = _metadata_alpha(meta)
    out = {}
    for module, parts in found.items():
        if "down" not in parts or "up" not in parts:
            raise TrainingAdapterError(f"{KEY}: {path} has an incomplete LoRA for {module} "
                                       "(a down or up matrix is missing)")
        rank = parts["down"].shape[0]
        alpha = float(parts["alpha"]) if "alpha" in parts else (default_alpha or float(rank))
        out[module] = (parts["down"], parts["up"], alpha / rank)
    return out


def unmatched_modules(path: str | Path, weight_names: set[str]) -> list[str]:
    """The file's modules that are not a 2-D weight of the base (`weight_names`: the
    base's tensor names, e.g. from its safetensors headers), with dots as underscores."""
    known = {name.removesuffix(".weight").replace(".", "_") for name in weight_names
             if name.endswith(".weight")}
    return sorted(set(adapter_modules(path)) - known)


def _linear_weights(denoiser: Any) -> dict[str, Any]:
    from core.models.modules import unwrap

    # Once the trained adapter is on, peft holds each adapted layer's weight under
    # "<module>.base_layer".
    return {name.removesuffix(".weight").replace(".base_layer", "").replace(".", "_"): param
            for name, param in unwrap(denoiser).named_parameters()
            if name.endswith(".weight") and param.ndim == 2 and "lora_" not in name}


def fuse_adapters(denoiser: Any, paths: list[str], sign: float = 1.0) -> int:
    """Add (sign 1) or take out (sign -1) each file's update to the denoiser's weights;
    returns how many modules it changed. Raises TrainingAdapterError naming a module the
    base does not have, before changing any weight."""
    import torch

    weights = _linear_weights(denoiser)
    files = [(path, adapter_modules(path)) for path in paths]
    for path, modules in files:
        missing = sorted(set(modules) - set(weights))
        if missing:
            raise TrainingAdapterError(
                f"{KEY}: {path} adapts {len(missing)} module(s) this {len(weights)}-weight "
                f"base does not have (e.g. {missing[0]}): it was made for another model")
    changed = 0
    with torch.no_grad():
        for _, modules in files:
            for name, (down, up, scale) in modules.items():
                weight = weights[name]
                update = (up.float() @ down.float()) * (scale * sign)
                if tuple(update.shape) != tuple(weight.shape):
                    raise TrainingAdapterError(
                        f"{KEY}: {name} is {tuple(update.shape)} in the adapter but "
                        f"{tuple(weight.shape)} in the base: made for another model")
                weight.add_(update.to(weight.device, weight.dtype))
                changed += 1
    return changed


@contextlib.contextmanager
def adapters_taken_out(denoiser: Any, paths: list[str], keep: bool) -> Iterator[None]:
    """The denoiser without its fused training adapters for the block (a validation
    round), then exactly as before: the adapted weights wait in host memory meanwhile,
    since subtracting and adding back in bf16 would round every weight a little each
    round. A no-op when there are none or `keep`."""
    if keep or not paths:
        yield
        return
    weights = _linear_weights(denoiser)
    names = {name for path in paths for name in adapter_modules(path)}
    fused = {name: weights[name].detach().to("cpu", copy=True) for name in names
             if name in weights}
    fuse_adapters(denoiser, paths, sign=-1.0)
    try:
        yield
    finally:
        import torch

        with torch.no_grad():
            for name, saved in fused.items():
                weights[name].copy_(saved.to(weights[name].device))

"""validation.model: validation drawn from another checkpoint of the same family (train
on Krea 2 Raw, preview on Krea 2 Turbo) with the run's current LoRA on it.

At each validation the other checkpoint is loaded on the CPU (`family.load`) in the
training base's dtype and its text encoders dropped at once (the prompts were encoded by
the run's, once); its denoiser, frozen, gets the adapter the run saves
(`lora_files.adapter_weights`: the same PEFT config and state dict) and goes to the GPU
for the pipeline, its VAE decodes, and all of it is freed afterwards. The training
denoiser is not touched. Its scheduler and config flags (is_distilled, guidance, the
pipeline class) come with it, so the pipeline samples as that checkpoint does.

Steps and guidance: when validation.steps and validation.guidance_scale are left at
their defaults, a distilled checkpoint (its model_index.json's is_distilled, or "turbo"
in its name) of a family that declares `validation.distilled` (its folder's family.py,
as the model card gives them) samples with those; a prompt's --s / --l still win.

Not carried over to the other checkpoint: model.quantize (it loads in the base dtype,
unquantized), model.prediction_type (its own scheduler's), model.blocks_to_swap (it goes
to the GPU whole beside the trained denoiser; the estimate counts it so). Refused at
check: a full fine-tune (no LoRA to put on it) and FSDP (the LoRA is sharded).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import ValidationConfig
from core.problems import Problem, error

if TYPE_CHECKING:
    from core.models.base import Components, ModelFamily

KEY = "validation.model"


def model_problems(cfg: Any, workspace: str | Path) -> list[Problem]:
    """validation.model (resolved) checked as model.path is (offline, same family, a
    missing folder named), each problem under validation.model; and a LoRA run only,
    without FSDP."""
    from core.models.loading import check_model_source

    path = cfg.validation.model
    if not path:
        return []
    if cfg.train.method != "lora":
        return [error(KEY, f"draws {path} with the run's LoRA: it needs train.method = "
                           f"lora (this run is {cfg.train.method}); leave it empty")]
    if cfg.launch.distributed == "fsdp":  # the adapter is sharded: not one state dict
        return [error(KEY, f"draws {path} with the run's LoRA, which launch.distributed = "
                           "\"fsdp\" shards across the processes: leave it empty, or use "
                           "\"ddp\"")]
    found = check_model_source(path, cfg.model.family, KEY, workspace)
    return [dataclasses.replace(p, message=p.message.replace("model.path", KEY))
            for p in found] or _settings_warnings(cfg)


def _settings_warnings(cfg: Any) -> list[Problem]:
    """A distilled validation.model drawn with steps or guidance set away from both the
    defaults and its own (a preset's 28 steps at guidance 4 on a Turbo): a warning."""
    from core.problems import warning

    v, default = cfg.validation, ValidationConfig()
    own = _distilled(cfg.model.family) if _named_distilled(v.model) else None
    if own is None:
        return []
    out = []
    for key, value, base, wanted in (("steps", v.steps, default.steps, own[0]),
                                     ("guidance_scale", v.guidance_scale,
                                      default.guidance_scale, own[1])):
        if value not in (base, wanted):
            out.append(warning(f"validation.{key}", f"is {value:g} for {v.model}, a "
                               f"distilled checkpoint that samples at {wanted:g}: leave it "
                               f"at its default ({base:g}) to draw with the checkpoint's"))
    return out


def _distilled(family: str) -> tuple[int, float] | None:
    """The family's distilled checkpoints' (steps, guidance_scale), from its folder."""
    from core.models.registry import family_or_defaults

    return family_or_defaults(family).validation.distilled


def _named_distilled(path: str) -> bool:
    """Whether a validation.model folder's model_index.json says is_distilled, or its
    name says turbo (read without loading it)."""
    import json

    index = Path(path).expanduser() / "model_index.json"
    try:
        if json.loads(index.read_text(encoding="utf-8")).get("is_distilled") is True:
            return True
    except (OSError, ValueError, AttributeError):
        pass
    return "turbo" in Path(path).name.lower()


def resolve(cfg: Any, workspace: Path) -> None:
    """validation.model = tiny:<name> built in the workspace (the trainer's start)."""
    from core.models.tiny import resolve_model_path

    if cfg.validation.model:
        cfg.validation.model = resolve_model_path(cfg.validation.model, workspace)


def checkpoint_sampling(family: str, other: Components) -> tuple[int, float] | None:
    """(steps, guidance_scale) the checkpoint `other` samples with, when it is a distilled
    one of a family that declares `validation.distilled`; None: validation.steps and
    guidance_scale as they are."""
    # A family whose model_index.json says is_distilled keeps it on its Components.
    flagged = bool(getattr(other, "is_distilled", False))
    distilled = flagged or "turbo" in Path(other.source).name.lower()
    return _distilled(family) if distilled else None


def sampling_settings(cfg: ValidationConfig, family: str, other: Components) -> ValidationConfig:
    """`cfg` with the checkpoint's own steps and guidance where cfg leaves the defaults."""
    found = checkpoint_sampling(family, other)
    if found is None:
        return cfg
    default = ValidationConfig()
    steps = found[0] if cfg.steps == default.steps else cfg.steps
    guidance = found[1] if cfg.guidance_scale == default.guidance_scale else cfg.guidance_scale
    return dataclasses.replace(cfg, steps=steps, guidance_scale=guidance)


def _base_dtype(denoiser: Any) -> Any:
    """The frozen base weights' dtype (the adapter's are fp32)."""
    params = list(denoiser.parameters())
    frozen = [p for p in params if not p.requires_grad]
    return (frozen or params)[0].dtype


def with_run_lora(denoiser: Any, trained: Any) -> Any:
    """`denoiser` frozen, holding the adapter of `trained` (its config and weights, as the
    run saves them), the adapter in fp32 as in training; Wan 2.2's two experts
    (`trained_experts`, by name): each trained expert's adapter onto its namesake."""
    if callable(getattr(trained, "trained_experts", None)):
        denoiser.requires_grad_(False)
        others = denoiser.experts()
        for name, expert in trained.trained_experts().items():
            _adapter_onto(others[name], expert)
        return denoiser.eval()
    return _adapter_onto(denoiser, trained)


def _adapter_onto(denoiser: Any, trained: Any) -> Any:
    import torch
    from peft.utils import set_peft_model_state_dict

    from core.models.lora_files import adapter_weights

    weights, config = adapter_weights(trained)
    denoiser.requires_grad_(False)
    denoiser.add_adapter(copy.deepcopy(config))
    set_peft_model_state_dict(denoiser, weights)
    for name, param in denoiser.named_parameters():
        if param.requires_grad or "lora_" in name or "lokr_" in name or "hada_" in name:
            param.data = param.data.to(torch.float32)
    denoiser.requires_grad_(False)
    denoiser.eval()
    return denoiser


@contextmanager
def validation_model(family: ModelFamily, components: Components, cfg: ValidationConfig,
                     device: Any) -> Iterator[tuple[Components, ValidationConfig]]:
    """The components and settings validation draws with: `components` and `cfg` as they
    are without validation.model; else the other checkpoint's (see the module docstring),
    freed on leaving."""
    if not cfg.model:
        yield components, cfg
        return
    from core.models.modules import unwrap

    trained = unwrap(components.denoiser)
    other = family.load(cfg.model, dtype=_base_dtype(trained), device="cpu")
    drawn = dataclasses.replace(
        other, text_encoders=components.text_encoders,
        tokenizers=components.tokenizers, flow=components.flow,
        denoiser=with_run_lora(other.denoiser, trained).to(device))
    del other
    try:
        yield drawn, sampling_settings(cfg, family.name, drawn)
    finally:
        drawn.denoiser.to("cpu")
        del drawn
        _free(device)


def _free(device: Any) -> None:
    import torch

    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()

"""model.training_adapter's rules at --stage check (the fusing is
core/models/training_adapter.py): each file a plain LoRA whose modules are the base's,
on a LoRA run, and taken out for validation only where the weights allow it."""

from __future__ import annotations

from pathlib import Path

from core.config.schema import Config
from core.problems import Problem, error

KEY = "model.training_adapter"
DENOISER_FOLDERS = ("transformer", "unet")


def base_weight_names(model_path: str, family: str) -> set[str] | None:
    """The denoiser's tensor names, from a diffusers folder's safetensors headers or a
    random: model's configs; None where they cannot be read without loading (a single
    file, a hub id, tiny: before it is built): the trainer names a mismatch then."""
    from core.models.source import model_source, safetensors_header
    from core.models.stream_files import weight_files

    source = model_source(model_path)
    if source.kind == "folder":
        for sub in DENOISER_FOLDERS:
            files = weight_files(source.text, sub)
            if files:
                return {name for f in files for name in safetensors_header(str(f))}
        return None
    if source.kind == "random":
        from core.models.full_size.meta import instantiate
        from core.models.full_size.spec import model_components

        sub = next((s for s in DENOISER_FOLDERS if s in model_components(family)), None)
        if sub is None:
            return None
        return {name for name, _ in instantiate(family, sub, meta_buffers=True)
                .named_parameters()}
    return None


def _validation_problem(cfg: Config) -> Problem | None:
    """Validation takes the adapter out of the weights, which quantized, swapped or
    sharded weights do not allow."""
    if cfg.validation.with_training_adapter or not cfg.validation.prompts:
        return None
    why = ("quantized" if cfg.model.quantize != "none" else
           "swapped to host memory" if cfg.model.blocks_to_swap else
           "sharded" if cfg.launch.distributed == "fsdp" else "")
    if not why:
        return None
    return error("validation.with_training_adapter",
                 f"off, with {KEY}: validation would take the adapter out of the base's "
                 f"weights, which are {why} in this run; set it to true (validation then "
                 "samples with the adapter) or clear validation.prompts")


def training_adapter_problems(cfg: Config) -> list[Problem]:
    """`cfg` resolved (paths absolute)."""
    from core.models.training_adapter import TrainingAdapterError, unmatched_modules

    if not cfg.model.training_adapter:
        return []
    if cfg.train.method != "lora":
        return [error(KEY, "is for a LoRA run: a full fine-tune would save the adapter "
                           "into its weights; set train.method = \"lora\" or clear it")]
    out = []
    names = None
    for path in cfg.model.training_adapter:
        if not Path(path).is_file():
            out.append(error(KEY, f"{path} is not a file; give a LoRA .safetensors file"))
            continue
        try:
            names = names if names is not None else base_weight_names(
                cfg.model.path, cfg.model.family) or set()
            missing = unmatched_modules(path, names) if names else []
        except TrainingAdapterError as exc:
            out.append(error(KEY, str(exc).removeprefix(f"{KEY}: ")))
            continue
        if missing:
            out.append(error(KEY, f"{path} adapts {len(missing)} module(s) that "
                                  f"{cfg.model.path} does not have (e.g. {missing[0]}): it "
                                  f"was made for another model than this {cfg.model.family} "
                                  "base"))
    problem = _validation_problem(cfg)
    return out + ([problem] if problem else [])

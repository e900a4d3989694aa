"""Settings of a config that would make its run need less GPU memory: the check's memory
line offers them when the estimate does not fit, and the trainer and the cache builder
when the GPU ran out. It reads the config alone, so all of them can use it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from core.config.optimizers import OPTIMIZERS

if TYPE_CHECKING:
    from core.config import Config


def lower_memory_settings(cfg: Config) -> list[str]:
    """Settings of this config that would lower what a training step needs."""
    from core.models.registry import family_or_defaults

    t = cfg.train
    out = []
    if t.method == "full":
        out.append('train.method = "lora"')
    elif cfg.model.quantize == "none" and t.lora_kind == "lora":  # others: not quantized
        out.append('model.quantize = "int8"')
    if t.method == "lora" and family_or_defaults(cfg.model.family).block_lists:
        out.append("a larger model.blocks_to_swap" if cfg.model.blocks_to_swap else
                   "model.blocks_to_swap (blocks of the denoiser kept in host memory)")
    if not t.gradient_checkpointing:
        out.append("train.gradient_checkpointing = true")
    if t.batch_size > 1:
        out.append("a smaller train.batch_size (with train.grad_accum)")
    lighter = OPTIMIZERS[t.optimizer].lighter if t.optimizer in OPTIMIZERS else ""
    if t.method == "full" and lighter:
        out.append(f'train.optimizer = "{lighter}"')
    if t.mixed_precision == "no":
        out.append('train.mixed_precision = "bf16"')
    return out


# Where a run can run out of GPU memory, as the refusal says it.
OUT_OF_MEMORY_DURING = {"setup": "while loading the model or building the caches",
                        "caches": "while building the caches",
                        "step": "in training step {step}", "eval": "in the eval at step {step}",
                        "validation": "in validation at step {step}",
                        "checkpoint": "while saving the checkpoint of step {step}"}


def out_of_memory_text(cfg: Config, part: str, step: int, said: str) -> str:
    """What to say when the GPU ran out of memory in `part` of the run (a key of
    OUT_OF_MEMORY_DURING) at `step`: torch's figures from what it `said`, and the
    settings that would need less."""
    figures = [piece.strip() for piece in said.replace("\n", " ").split(". ")
               if "Tried to allocate" in piece or "total capacity" in piece]
    detail = f" ({'; '.join(figures)})" if figures else ""
    if part == "caches":  # the encoders and the VAE: their dtype and the image sizes
        settings = [s for s in lower_memory_settings(cfg) if "mixed_precision" in s]
        if not cfg.model.stream_text_encoders:
            settings.insert(0, "model.stream_text_encoders = true")
    else:
        settings = lower_memory_settings(cfg)
    if part == "validation":
        settings.insert(0, "a lower validation.resolution")
    elif part in ("step", "eval", "caches"):
        settings.append("a lower resolution for the datasets")
    advice = f"; to need less: {', '.join(settings)}" if settings else ""
    during = OUT_OF_MEMORY_DURING[part].format(step=step)
    return (f"the GPU ran out of memory {during}{detail}{advice}. "
            "`--stage check` estimates what a config needs.")


@contextlib.contextmanager
def out_of_memory_becomes(error: type[Exception], cfg: Config, part: str,
                          step: int = 0) -> Iterator[None]:
    """torch's out-of-memory error inside becomes `error` with out_of_memory_text (the
    caller's refusal: the trainer's TrainingError, the cache job's own); any other
    error goes through as it is."""
    from core.models.modules import is_out_of_memory

    try:
        yield
    except Exception as exc:
        if is_out_of_memory(exc):
            raise error(out_of_memory_text(cfg, part, step, str(exc))) from None
        raise

"""Settings of a config that would make its run need less GPU memory: the check's memory
line offers them when the estimate does not fit, and the trainer when the GPU ran out.
It reads the config alone, so both can use it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config import Config


def lower_memory_settings(cfg: Config) -> list[str]:
    """Settings of this config that would lower what a training step needs."""
    t = cfg.train
    out = []
    if t.method == "full":
        out.append('train.method = "lora"')
    elif cfg.model.quantize == "none" and t.lora_kind == "lora":  # others: not quantized
        out.append('model.quantize = "int8"')
    if not t.gradient_checkpointing:
        out.append("train.gradient_checkpointing = true")
    if t.batch_size > 1:
        out.append("a smaller train.batch_size (with train.grad_accum)")
    if t.method == "full" and t.optimizer == "adamw":
        out.append('train.optimizer = "adamw8bit"')
    if t.mixed_precision == "no":
        out.append('train.mixed_precision = "bf16"')
    return out

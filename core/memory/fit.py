"""The changes that make a plan fit its card: when the estimate is more than the GPU has,
the cheapest set of settings with which every phase is at least FIT_MARGIN under it, the
margin the card presets keep (tools/card_presets.py). The Training tab offers the set as
one button; the check prints it as `--set` items.

The order of cost: gradient checkpointing on (slower steps, nothing lost), the text
encoders streamed when building the caches is over (a slower cache build, once), then
the fewest swapped blocks (slower steps, host RAM), and a quantized base (int8) only
when no swap count is enough without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from core.memory.host import host_limit
from core.memory.report import GIB, FitPlan
from core.memory.swap import machine_ram_bytes

if TYPE_CHECKING:
    from core.config import Config
    from core.memory.model_counts import ModelSizes
    from core.memory.report import MemoryEstimate

FIT_MARGIN = 3 * GIB // 2
# What a fit may change (the Training tab's button writes these fields).
FIT_KEYS = ("model.quantize", "model.stream_text_encoders", "model.blocks_to_swap",
            "train.gradient_checkpointing")


Assemble = Callable[["Config", "ModelSizes"], "MemoryEstimate"]


def fitting_plan(cfg: Config, sizes: ModelSizes, estimate: MemoryEstimate,
                 assemble: Assemble) -> FitPlan | None:
    """The changes with which `estimate` (made by `assemble` from `cfg`) fits its card
    with FIT_MARGIN to spare, or None: it fits, there is no card, or nothing here fits."""
    card = estimate.device_total_bytes
    if card is None or estimate.total_bytes <= card:
        return None
    target = card - FIT_MARGIN
    caching = bool(estimate.caching)  # built caches: no caching phase to fit
    ram = host_limit(cfg, machine_ram_bytes())  # what the training may fill
    for trial in _trials(cfg):
        if (caching and not trial.model.stream_text_encoders
                and assemble(trial, sizes).caching_bytes > target
                and _streams(trial, sizes, assemble, target)):
            trial.model.stream_text_encoders = True
        found = _fewest_swapped(trial, sizes, assemble, (target, ram), caching,
                                estimate.max_blocks)
        if found is not None:
            return FitPlan(_changes(cfg, trial), _phases(found, caching),
                           sum(p.bytes for p in found.host))
    return None


def _trials(cfg: Config) -> list[Config]:
    """The config with gradient checkpointing on (a LoRA), then also quantized to int8
    where the base is not quantized yet and the LoRA kind allows it."""
    def copy(quantize: str) -> Config:
        trial = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, quantize=quantize),
                                    train=dataclasses.replace(cfg.train))
        if trial.train.method == "lora":
            trial.train.gradient_checkpointing = True
        return trial

    out = [copy(cfg.model.quantize)]
    if (cfg.model.quantize == "none" and cfg.train.method == "lora"
            and cfg.train.lora_kind == "lora"):
        out.append(copy("int8"))
    return out


def _streams(trial: Config, sizes: ModelSizes, assemble: Assemble, target: int) -> bool:
    """Whether streaming the text encoders brings the cache build under `target`."""
    streamed = dataclasses.replace(trial, model=dataclasses.replace(
        trial.model, stream_text_encoders=True))
    return assemble(streamed, sizes).caching_bytes <= target


def _fewest_swapped(trial: Config, sizes: ModelSizes, assemble: Assemble,
                    limits: tuple[int, int | None], caching: bool, max_blocks: int | None
                    ) -> MemoryEstimate | None:
    """The estimate at the smallest model.blocks_to_swap (from the configured one) that
    brings every phase under the GPU's limit, left set on `trial`; None when none does,
    or when the blocks it pins would not leave the training's host memory under the RAM's
    limit (more blocks only pin more)."""
    from core.config.block_swap import block_swap_problems

    swappable = trial.train.method == "lora" and max_blocks
    last = (max_blocks or 0) if swappable else trial.model.blocks_to_swap
    for count in range(trial.model.blocks_to_swap, last + 1):
        trial.model.blocks_to_swap = count
        if count and any(p.level == "error" for p in block_swap_problems(trial)):
            return None
        planned = assemble(trial, sizes)
        target, ram = limits
        if ram is not None and sum(p.bytes for p in planned.host_training) > ram:
            return None
        if _phases(planned, caching) <= target:
            return planned
    return None


def _phases(estimate: MemoryEstimate, caching: bool) -> int:
    phases = [estimate.training_bytes, estimate.validation_bytes]
    return max(phases + ([estimate.caching_bytes] if caching else []))


def _changes(cfg: Config, trial: Config) -> dict[str, Any]:
    """The keys of FIT_KEYS whose value differs in `trial`, in that order."""
    def value(c: Config, key: str) -> Any:
        section, name = key.split(".")
        return getattr(getattr(c, section), name)

    return {key: value(trial, key) for key in FIT_KEYS if value(trial, key) != value(cfg, key)}

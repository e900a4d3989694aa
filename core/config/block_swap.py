"""model.blocks_to_swap's rules that the config alone decides (the block count, which
needs the model's configs, is checked with the memory estimate in core/check.py)."""

from __future__ import annotations

from core.config.schema import Config
from core.models.registry import family_or_defaults
from core.problems import Problem, error, warning

KEY = "model.blocks_to_swap"


def parks_inactive_expert(cfg: Config) -> bool:
    """model.offload_inactive_expert (a key of the families with experts, as Wan's
    options.py declares it) resolved: "auto" is on when blocks swap (the base does not
    fit the card), as the trainer and the memory estimate both read it; off for a family
    without experts."""
    if family_or_defaults(cfg.model.family).experts is None:
        return False
    choice = cfg.model.offload_inactive_expert
    return choice == "on" or (choice == "auto" and cfg.model.blocks_to_swap > 0)


def block_swap_problems(cfg: Config) -> list[Problem]:
    """What blocks_to_swap and stream_text_encoders cannot be combined with, each naming
    the key and the fix."""
    out = []
    if cfg.model.stream_text_encoders and cfg.train.text_encoder_lora:
        out.append(error("model.stream_text_encoders", "with train.text_encoder_lora: a "
                         "text encoder that trains cannot stream its layers (they would "
                         "have to come back with their gradients); set one of them to false"))
    return out + _swap_problems(cfg)


def _swap_problems(cfg: Config) -> list[Problem]:
    count = cfg.model.blocks_to_swap
    if not count:
        return []
    family = family_or_defaults(cfg.model.family)
    if not family.block_lists:
        return [error(KEY, f"{count}: {cfg.model.family} has no transformer blocks to swap "
                           "(a UNet streams badly block by block); set it to 0 and save "
                           "memory with model.quantize and train.gradient_checkpointing")]
    out = []
    if cfg.train.method != "lora":
        out.append(error(KEY, f"{count} with train.method = \"{cfg.train.method}\": swapping "
                              "streams frozen weights only, and a full fine-tune trains every "
                              "weight; use train.method = \"lora\" or set it to 0"))
    if not cfg.train.gradient_checkpointing:
        out.append(error("train.gradient_checkpointing", f"is off with {KEY} = {count}: "
                         "without it autograd keeps every block's weights on the GPU from "
                         "the forward to the backward, so swapping would save nothing; set "
                         "train.gradient_checkpointing = true"))
    if cfg.launch.cpu:
        out.append(warning(KEY, f"{count} on the CPU (launch.cpu) saves no memory: host and "
                                "device are the same there"))
    return out

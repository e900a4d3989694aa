"""model.experts and what a two-expert (Wan 2.2 A14B) model does not take yet, checked
twice: at `--stage check` where the model's experts are known without loading it (tiny
and random names, a local folder's model_index.json, a single file), and when the
trainer has loaded it (`run_refusal`, every source, hub ids included). No torch here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.models.families.wan.options import EXPERT_CHOICES
from core.models.source import model_source
from core.problems import Problem, error

BOTH, HIGH, LOW = EXPERT_CHOICES  # model.experts
TWO_EXPERT_TINY = "wan22"  # tiny:wan22 (tiny22/); tiny:wan has one transformer


def expert_count(path: str) -> int | None:
    """How many experts model.path has, where known without loading: tiny:wan22 and a
    folder whose model_index.json names a transformer_2 have two; tiny:wan, random:wan
    (Wan 2.1's configs), another folder and a single file (one transformer) have one.
    None where unknown (a hub id, a missing path)."""
    source = model_source(path)
    if source.kind == "tiny":
        return 2 if source.name == TWO_EXPERT_TINY else 1
    if source.kind in ("random", "file"):
        return 1
    if source.kind != "folder":
        return None
    try:
        index = json.loads((Path(path).expanduser() / "model_index.json").read_text(
            encoding="utf-8"))
    except (OSError, ValueError):
        return None
    second = index.get("transformer_2")
    return 2 if isinstance(second, list) and second and second[0] is not None else 1


def run_refusal(cfg: Any, experts: int) -> tuple[str, str] | None:
    """(key, message) of the first setting a model with `experts` transformers cannot
    train with, or None."""
    if experts == 1:
        if cfg.model.experts != BOTH:
            return ("model.experts", f"is {cfg.model.experts!r}, which picks one of Wan "
                    f"2.2's two experts, but {cfg.model.path} has one transformer (Wan 2.1); "
                    "set model.experts = \"both\"")
        return None
    if cfg.train.init_lora:
        return ("train.init_lora", f"{cfg.model.path} has two experts (Wan 2.2), and a "
                "starting LoRA is loaded into single-transformer models only; leave "
                "train.init_lora empty")
    if cfg.launch.distributed == "fsdp":
        return ("launch.distributed", f"fsdp does not shard {cfg.model.path}'s two "
                "experts (Wan 2.2) yet; use \"ddp\"")
    return None


def expert_problems(cfg: Any) -> list[Problem]:
    """The check's problems of model.experts (see the module docstring)."""
    count = expert_count(cfg.model.path)
    found = None if count is None else run_refusal(cfg, count)
    return [] if found is None else [error(*found)]

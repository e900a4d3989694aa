"""The trainer's refusal, below setup and the cross-machine agreement, which both raise
it (it lived in setup.py, and agreement.py importing it from there made an import
circle: setup -> agreement -> setup)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config import Config


class TrainingError(Exception):
    """A problem the user can act on; the message says what to do."""


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's CUDA out-of-memory error (torch.OutOfMemoryError)."""
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


# Where a run can run out of GPU memory, as the refusal says it.
OUT_OF_MEMORY_DURING = {"setup": "while loading the model or building the caches",
                        "step": "in training step {step}", "eval": "in the eval at step {step}",
                        "validation": "in validation at step {step}",
                        "checkpoint": "while saving the checkpoint of step {step}"}


def out_of_memory(cfg: Config, part: str, step: int, exc: BaseException) -> TrainingError:
    """The refusal for a GPU that ran out of memory in `part` of the run (a key of
    OUT_OF_MEMORY_DURING) at `step`: torch's figures, and the settings that would need
    less."""
    from core.config.memory_advice import lower_memory_settings

    said = str(exc).replace("\n", " ")
    figures = [piece.strip() for piece in said.split(". ")
               if "Tried to allocate" in piece or "total capacity" in piece]
    detail = f" ({'; '.join(figures)})" if figures else ""
    settings = lower_memory_settings(cfg)
    if part == "validation":
        settings.insert(0, "a lower validation.resolution")
    elif part in ("step", "eval"):
        settings.append("a lower resolution for the datasets")
    advice = f"; to need less: {', '.join(settings)}" if settings else ""
    during = OUT_OF_MEMORY_DURING[part].format(step=step)
    return TrainingError(f"the GPU ran out of memory {during}{detail}{advice}. "
                         "`--stage check` estimates what a config needs.")

"""The trainer's refusal, below setup and the cross-machine agreement, which both raise
it (it lived in setup.py, and agreement.py importing it from there made an import
circle: setup -> agreement -> setup)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config import Config


class TrainingError(Exception):
    """A problem the user can act on; the message says what to do."""


def out_of_memory(cfg: Config, part: str, step: int, exc: BaseException) -> TrainingError:
    """The refusal for a GPU that ran out of memory in `part` of the run at `step`
    (core/config/memory_advice.py: out_of_memory_text)."""
    from core.config.memory_advice import out_of_memory_text

    return TrainingError(out_of_memory_text(cfg, part, step, str(exc)))

"""What a run needs on each GPU, estimated before launch from the model's configs alone
(no weights loaded): frozen weights, trainable parameters, gradients and optimizer states
exactly, activations as an estimate. `--stage check` and the Training tab print it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.config import Config

GIB = 1024 ** 3


@dataclass
class MemoryPart:
    name: str  # "frozen weights", "trainable", "gradients", "optimizer", "activations"
    bytes: int
    exact: bool = True


@dataclass
class MemoryEstimate:
    parts: list[MemoryPart] = field(default_factory=list)
    device_total_bytes: int | None = None  # the detected GPU's memory, when there is one

    @property
    def total_bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    def lines(self) -> list[str]:
        """The first starts with `memory:` and gives the per-GPU figure in GiB."""
        return [f"memory: {self.total_bytes / GIB:.1f} GiB per GPU"]


def estimate_memory(cfg: Config, workspace: Path) -> MemoryEstimate | None:
    """The per-GPU estimate for `cfg` (paths resolved), or None when the model's configs
    cannot be read without a download."""
    return None

"""The steps between two reads of the loss (train.log_every): their losses stay on the
device until then, so the loop never waits for the device in between.

Reading a loss (float(tensor), .item()) makes the host wait until the device has run
every queued kernel; doing that every step leaves a GPU idle while the host prepares the
next step (reads the cache, collates, copies). Without the wait the host prepares step
k+1 while the device still runs step k, which is the prefetch a GPU needs (the batch's
copy is non-blocking from pinned memory: core/train/batches.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GPU_LOG_EVERY = 10


def log_interval(log_every: int, device: Any) -> int:
    """train.log_every resolved: 0 is every step on the CPU, GPU_LOG_EVERY elsewhere."""
    if log_every:
        return log_every
    import torch

    return 1 if torch.device(device).type == "cpu" else GPU_LOG_EVERY


@dataclass
class PendingSteps:
    """Steps done whose losses are still on the device: (step, loss tensor, lr, epoch)."""

    every: int
    rows: list[tuple[int, Any, float, int]] = field(default_factory=list)

    def add(self, step: int, losses: list[Any], lr: float, epoch: int) -> None:
        import torch

        self.rows.append((step, torch.stack(losses).mean().float(), lr, epoch))

    def due(self, step: int, first: bool, other: bool) -> bool:
        """Read now: every `every` steps, at the launch's first step (the start-up
        report), or when `other` (a round, the last step, a stop) follows this step."""
        return first or other or step % self.every == 0

    def read(self, accelerator: Any, stop: Any) -> tuple[list[tuple[int, float, float, int]],
                                                         bool]:
        """The pending steps with their losses (the mean over every process) and whether
        any process was asked to stop, in one read (one collective when distributed), so
        all processes stop at the same step."""
        import torch

        local = torch.stack([row[1] for row in self.rows])
        wanted = 1.0 if stop.requested() else 0.0
        if accelerator.num_processes == 1:
            losses, stopping = local.tolist(), wanted > 0
        else:
            both = torch.cat([local, torch.tensor([wanted], device=local.device)])
            gathered = accelerator.gather(both.unsqueeze(0))  # [processes, steps + 1]
            losses = gathered[:, :-1].mean(0).tolist()
            stopping = bool(gathered[:, -1].max() > 0)
        rows = [(step, loss, lr, epoch)
                for (step, _, lr, epoch), loss in zip(self.rows, losses, strict=True)]
        self.rows = []
        return rows, stopping

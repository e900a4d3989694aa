"""Intermediate LoRAs: lora/step_NNNNNN/, the LoRA files of the weights at a step.

Written at every checkpoint and, with train.save_every_epochs = N, at the end of every
N-th epoch; pruning checkpoints (train.keep_checkpoints) never removes them. The files are
the ones the final save writes into lora/, through the same function (`write` below), so
each folder loads the same way. Only the main process calls this.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from core.files import atomic_path, replace_folder
from core.runs.folder import RunFolder

WriteLora = Callable[[Path], dict[str, Path]]


def save_lora_step(run_dir: Path, step: int, write: WriteLora) -> dict[str, Path]:
    """`write(folder)` into a temp folder, then one rename: a step_* folder is always
    complete (as checkpoints are). Returns the files by format, at their final paths."""
    final = RunFolder(run_dir).lora_step(step)
    # replace_folder: this run's own save of the step (a resume passing it again) goes
    with atomic_path(final, temp=f".tmp-{final.name}", swap=replace_folder) as tmp:
        files = write(tmp)
    return {kind: final / path.name for kind, path in files.items()}


def epoch_save_due(every: int, epoch: int, epoch_complete: bool) -> bool:
    """train.save_every_epochs = `every`: does the step just done end an epoch to save?
    `epoch` counts from 0, so the N-th epoch is epoch N-1."""
    return every > 0 and epoch_complete and (epoch + 1) % every == 0


@contextlib.contextmanager
def ema_weights(ema: Any, params: list[Any]) -> Iterator[None]:
    """The EMA average in `params` for the duration (what the final save writes, so an
    intermediate LoRA is what the run would have saved had it ended there), then the raw
    weights back, so training goes on unchanged."""
    if ema is None:
        yield
        return
    ema.store(params)
    ema.copy_to(params)
    try:
        yield
    finally:
        ema.restore(params)

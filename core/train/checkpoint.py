"""Checkpoints that resume the same curve, and are never half-written.

    checkpoints/step_000250/
        trainable.safetensors   the trained weights only (LoRA layers, or the full denoiser)
        optimizer.pt            optimizer state (identical on every process under DDP)
        scheduler.pt            learning-rate scheduler state
        ema.pt                  EMA weights, when EMA is on
        sampler.json            the multi-dataset sampler's position
        rng_<rank>.pt           python, torch (and CUDA) RNG of every process
        meta.json               step, epoch, training method and model family

The main process writes everything into `.tmp-step_...` (every process's RNG state
reaches it through a collective, so no other process writes into a folder it may not see
yet, e.g. on a network filesystem) and renames the folder, so a folder named step_* is
always complete. Only the newest `keep` are kept.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.files import atomic_path, replace_folder
from core.runs.folder import RunFolder, step_name


@dataclass
class TrainState:
    """Everything besides the modules that a resumed run needs."""

    step: int
    epoch: int
    sampler: dict[str, Any]


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    return RunFolder(run_dir).checkpoint_folders()


def rng_state() -> dict[str, Any]:
    import torch

    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, rank: int, barrier: Any, *, gather: Any,
                    trainable: dict, optimizer: Any, scheduler: Any, ema: Any,
                    state: TrainState, meta: dict[str, Any], keep: int) -> Path | None:
    """Called on every process; returns the final folder on the main process.

    `gather(obj)` returns every process's `obj` in rank order (accelerate's
    gather_object); `barrier` lets the others go on only once the folder is complete.
    """
    import torch
    from safetensors.torch import save_file

    rng_states = gather(rng_state())
    if rank != 0:
        barrier()
        return None
    final = RunFolder(run_dir).checkpoint(step)
    # replace_folder: a resumed run passing the same step again replaces its checkpoint
    with atomic_path(final, temp=f".tmp-{step_name(step)}", folder=True,
                     swap=replace_folder) as tmp:
        for index, rng in enumerate(rng_states):
            torch.save(rng, tmp / f"rng_{index}.pt")
        save_file({k: v.detach().contiguous().cpu() for k, v in trainable.items()},
                  tmp / "trainable.safetensors")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        if ema is not None:
            torch.save(ema.state_dict(), tmp / "ema.pt")
        (tmp / "sampler.json").write_text(json.dumps(state.sampler), encoding="utf-8")
        (tmp / "meta.json").write_text(json.dumps({"step": step, "epoch": state.epoch,
                                                   **meta}, indent=1), encoding="utf-8")
    _prune(run_dir, keep)
    barrier()
    return final


def _prune(run_dir: Path, keep: int) -> None:
    for old in list_checkpoints(run_dir)[:-keep]:
        with contextlib.suppress(OSError):
            shutil.rmtree(old)


def load_checkpoint(folder: Path, rank: int) -> tuple[dict, dict[str, Any], TrainState]:
    """(trainable weights, other states, TrainState) from a checkpoint folder."""
    import torch
    from safetensors.torch import load_file

    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    states: dict[str, Any] = {
        "optimizer": torch.load(folder / "optimizer.pt", weights_only=False),
        "scheduler": torch.load(folder / "scheduler.pt", weights_only=False),
    }
    if (folder / "ema.pt").exists():
        states["ema"] = torch.load(folder / "ema.pt", weights_only=False)
    rng_file = folder / f"rng_{rank}.pt"
    if rng_file.exists():  # resuming with more processes than saved: fresh RNG for the new
        states["rng"] = torch.load(rng_file, weights_only=False)
    sampler = json.loads((folder / "sampler.json").read_text(encoding="utf-8"))
    state = TrainState(step=int(meta["step"]), epoch=int(meta.get("epoch", 0)), sampler=sampler)
    return load_file(folder / "trainable.safetensors"), states, state

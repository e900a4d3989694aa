"""Continuing a run from a checkpoint: the trained weights and states loaded into the
setup, and the resume said in the log (a changed dataset layout included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.runs.folder import RunFolder
from core.train.checkpoint import TrainState, load_checkpoint, set_rng_state
from core.train.report import Reporter
from core.train.setup import Setup, TrainingError


def trainable_state(setup: Setup) -> dict[str, Any]:
    """The trained weights by name: the denoiser's as named in it (as checkpoints have
    always been), a trained text encoder's under "text_encoders.<i>."."""
    out = {name: p for name, p in setup.base_denoiser.named_parameters() if p.requires_grad}
    for index, encoder in enumerate(setup.trained_encoders):
        out.update({f"text_encoders.{index}.{name}": p
                    for name, p in encoder.named_parameters() if p.requires_grad})
    return out


def restore(setup: Setup, run_dir: Path, which: str, reporter: Reporter) -> int:
    """Load a checkpoint into the setup; returns the step to continue from."""
    try:
        folder = RunFolder(run_dir).find_checkpoint(which)
    except FileNotFoundError as exc:  # a user's choice, not a crash: no traceback
        raise TrainingError(str(exc)) from None
    weights, states, state = load_checkpoint(folder, setup.accelerator.process_index)
    own = trainable_state(setup)
    missing = sorted(set(own) - set(weights))
    if missing:
        raise TrainingError(f"checkpoint {folder} does not fit this model/method "
                            f"({len(missing)} trained weights missing, e.g. {missing[0]})")
    if setup.sharded_class is not None:  # full states, resharded (core/train/sharding.py)
        from core.train.sharding import load_full_state

        load_full_state(setup.components.denoiser, setup.optimizer, weights,
                        states["optimizer"])
    else:
        with _no_grad():
            for name, param in own.items():
                param.copy_(weights[name].to(param.device, param.dtype))
        setup.optimizer.load_state_dict(states["optimizer"])
    setup.lr_scheduler.load_state_dict(states["scheduler"])
    if setup.ema is not None and "ema" in states:
        setup.ema.load_state_dict(states["ema"])
    changes = setup.sampler.layout_changes(state.sampler)
    setup.sampler.load_state_dict(state.sampler, strict=False)
    if "rng" in states:
        set_rng_state(states["rng"])
    _report_resume(reporter, folder, state, setup.sampler.epoch, changes)
    return state.step


def _report_resume(reporter: Reporter, folder: Path, state: TrainState, epoch: int,
                   changes: list[str]) -> None:
    """A `resume` event and log line; a changed dataset layout is said, not hidden: the
    saved position within the epoch no longer means anything, so the epoch restarts."""
    message = ""
    if changes:
        message = (f"the dataset layout changed since checkpoint {folder.name} ("
                   + "; ".join(changes) + f"): the position saved in epoch {state.epoch} "
                   f"no longer applies, so training continues from the start of epoch "
                   f"{epoch} (the step count goes on from {state.step})")
        reporter.say(f"warning: {message}")
    reporter.event("resume", step=state.step, checkpoint=str(folder), epoch=epoch,
                   layout_changes=changes, message=message)
    reporter.say(f"resumed from {folder} at step {state.step}")


def _no_grad() -> Any:
    import torch

    return torch.no_grad()

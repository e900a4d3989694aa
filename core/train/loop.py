"""The training loop: optimizer steps, eval, validation, checkpoints, a clean stop."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import Config
from core.data.collate import collate
from core.models.adapters import LYCORIS_ONLY_NOTE
from core.models.modules import unwrap
from core.runs.folder import RunFolder
from core.train.batches import to_device
from core.train.checkpoint import (
    TrainState,
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from core.train.evaluation import EvalSet, build_eval_set, evaluate
from core.train.grid import write_validation_grid
from core.train.report import Reporter
from core.train.saves import ema_weights, epoch_save_due, save_lora_step
from core.train.setup import Setup, TrainingError
from core.train.texts import batch_encoder
from core.train.validation import encode_validation_prompts, generate_validation_images

if TYPE_CHECKING:
    from core.models.base import Components


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
        folder = find_checkpoint(run_dir, which)
    except FileNotFoundError as exc:  # a user's choice, not a crash: no traceback
        raise TrainingError(str(exc)) from None
    weights, states, state = load_checkpoint(folder, setup.accelerator.process_index)
    own = trainable_state(setup)
    missing = sorted(set(own) - set(weights))
    if missing:
        raise TrainingError(f"checkpoint {folder} does not fit this model/method "
                            f"({len(missing)} trained weights missing, e.g. {missing[0]})")
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


def micro_step(setup: Setup, cfg: Config, batch_plan: Any) -> Any:
    """Forward and backward for one micro-batch; returns the detached loss."""
    acc, family, comps = setup.accelerator, setup.family, setup.components
    dataset = setup.datasets[batch_plan.dataset_index]
    trained = comps.text_encoders if setup.trained_encoders else []
    # Inside accumulate: a trained text encoder's forward is part of the step that
    # DDP synchronises (or not, between accumulation steps).
    with acc.accumulate(comps.denoiser, *trained):
        items = setup.texts.apply(comps, batch_plan.dataset_index,
                                  [dataset.load(i) for i in batch_plan.item_indices],
                                  batch_plan.micro_step)
        batch = to_device(collate(items), acc.device, setup.weight_dtype)
        sample = family.noise_and_target(comps, batch["latents"],
                                         noise_offset=cfg.train.noise_offset)
        with acc.autocast():
            prediction = family.predict(comps, sample, batch)
        loss = family.loss(comps, prediction.float(), sample, cfg.train.min_snr_gamma)
        acc.backward(loss)
        if acc.sync_gradients and cfg.train.max_grad_norm > 0:
            acc.clip_grad_norm_(setup.params, cfg.train.max_grad_norm)
        setup.optimizer.step()
        setup.optimizer.zero_grad(set_to_none=True)
    return loss.detach()


class Loop:
    def __init__(self, setup: Setup, cfg: Config, run_dir: Path, reporter: Reporter,
                 stop: Any) -> None:
        self.s, self.cfg, self.run_dir = setup, cfg, run_dir
        self.reporter, self.stop = reporter, stop
        self.eval_set: EvalSet | None = None
        self.last_saved_step = -1
        self.last_lora_step = -1

    @property
    def acc(self) -> Any:
        return self.s.accelerator

    def eval(self, step: int) -> None:
        started = time.monotonic()
        if self.acc.is_main_process and self.eval_set is not None:
            unwrapped = _unwrapped(self.s.components)
            # A trained text encoder re-encodes the eval captions as it is now.
            text = batch_encoder(self.s.family, unwrapped) if self.s.trained_encoders else None
            with self.acc.autocast():
                result = evaluate(self.s.family, unwrapped, self.eval_set, self.acc.device,
                                  self.s.weight_dtype, text)
            self.reporter.eval(step, result, _since(started))
        self.acc.wait_for_everyone()
        if self.eval_set is not None:
            self.reporter.took("eval", time.monotonic() - started)

    def validate(self, step: int) -> None:
        started = time.monotonic()
        if self.acc.is_main_process and self.cfg.validation.prompts:
            # The pipeline runs in the denoiser's dtype, from the prompts encoded up front,
            # or encoded now by the text encoders a LoRA trains.
            texts = self.s.validation_texts
            if self.s.trained_encoders:
                texts = encode_validation_prompts(self.s.family,
                                                  _unwrapped(self.s.components),
                                                  self.cfg.validation.prompts)
            paths = generate_validation_images(self.s.family, self.s.components,
                                               self.cfg.validation, self.run_dir, step,
                                               self.acc.device, texts)
            self.reporter.validation(step, paths, self.cfg.validation.prompts,
                                     _since(started))
            write_validation_grid(self.run_dir, self.cfg.validation.prompts)
        self.acc.wait_for_everyone()
        if self.cfg.validation.prompts:
            self.reporter.took("validation", time.monotonic() - started)

    def checkpoint(self, step: int) -> None:
        if step == self.last_saved_step:
            return
        started = time.monotonic()
        state = TrainState(step=step, epoch=self.s.sampler.epoch,
                           sampler=self.s.sampler.state_dict())
        folder = save_checkpoint(
            self.run_dir, step, self.acc.process_index, self.acc.wait_for_everyone,
            gather=_gather, trainable=trainable_state(self.s), optimizer=self.s.optimizer,
            scheduler=self.s.lr_scheduler, ema=self.s.ema, state=state,
            meta={"method": self.cfg.train.method, "family": self.cfg.model.family},
            keep=self.cfg.train.keep_checkpoints)
        self.last_saved_step = step
        self.reporter.took("checkpoint", time.monotonic() - started)
        if folder is not None:
            self.reporter.event("checkpoint", step=step, path=str(folder),
                                seconds=_since(started))
            self.reporter.say(f"checkpoint saved: {folder}")
        self.save_lora_step(step)

    def write_lora(self, out_dir: Path) -> dict[str, Path]:
        """The LoRA files (diffusers + kohya/ComfyUI formats) of the current weights into
        `out_dir`: the final save and every intermediate one write through here. The text
        encoders come unwrapped too, for a text-encoder LoRA."""
        comps = _with_denoiser(_unwrapped(self.s.components), self.s.base_denoiser)
        return self.s.family.save_lora(comps, out_dir)

    def save_lora_step(self, step: int) -> None:
        """lora/step_NNNNNN/ (core/train/saves.py); LoRA runs only: a full fine-tune saves
        its model once, at the end."""
        if self.cfg.train.method != "lora" or step == self.last_lora_step:
            return
        self.last_lora_step = step
        if self.acc.is_main_process:
            with ema_weights(self.s.ema, self.s.params):
                files = save_lora_step(self.run_dir, step, self.write_lora)
            self.reporter.lora_saved(step, files)
        self.acc.wait_for_everyone()

    def save_weights(self) -> None:
        """The trained LoRA (diffusers + kohya formats) or the full model."""
        if self.acc.is_main_process:
            comps = _with_denoiser(_unwrapped(self.s.components), self.s.base_denoiser)
            if self.cfg.train.method == "lora":
                files = self.write_lora(RunFolder(self.run_dir).lora)
                self.reporter.say("LoRA saved: " + ", ".join(str(p) for p in files.values()))
                if "diffusers" not in files:
                    self.reporter.say(f"note: {LYCORIS_ONLY_NOTE}")
            else:
                pipe = self.s.family.validation_pipeline(comps)
                model_dir = RunFolder(self.run_dir).model
                pipe.save_pretrained(str(model_dir), safe_serialization=True)
                self.reporter.say(f"model saved: {model_dir}")
        self.acc.wait_for_everyone()

    def loss_and_stop(self, losses: list[Any]) -> tuple[float, bool]:
        """The step's mean loss over every process and whether any process was asked to
        stop, in one collective, so all processes stop at the same step."""
        import torch

        local = torch.stack(losses).mean().float()
        wanted = 1.0 if self.stop.requested() else 0.0
        if self.acc.num_processes == 1:
            return float(local), wanted > 0
        both = torch.stack([local, torch.tensor(wanted, device=local.device)])
        gathered = self.acc.gather(both.unsqueeze(0))  # [processes, 2]
        return float(gathered[:, 0].mean()), bool(gathered[:, 1].max() > 0)

    def periodic(self, step: int, final: bool) -> None:
        if final or step % self.cfg.train.eval_every == 0:
            self.eval(step)
        # Each round tells the reporter its time (`took`): kept out of it/s, counted in
        # the ETA.
        if final or step % self.cfg.validation.every == 0:
            self.validate(step)
        if not final and step % self.cfg.train.checkpoint_every == 0:
            self.checkpoint(step)
        if not final and epoch_save_due(self.cfg.train.save_every_epochs, self.s.sampler.epoch,
                                        self.s.sampler.epoch_complete):
            started = time.monotonic()  # the last step's save comes with its checkpoint
            self.save_lora_step(step)
            self.reporter.took("lora_save", time.monotonic() - started)

    def run(self, start_step: int) -> str:
        """Train to max_steps; returns the final state: done or stopped."""

        cfg, s = self.cfg, self.s
        self.eval_set = build_eval_set(s.family, s.components, s.datasets,
                                       cfg.train.eval_images, cfg.train.batch_size,
                                       lambda items: s.texts.fill(_unwrapped(s.components),
                                                                  items))
        if start_step == 0:
            self.eval(0)
            if cfg.validation.before_training:
                self.validate(0)
        batches = iter(s.sampler)
        step = start_step
        while step < cfg.train.max_steps:
            losses = [micro_step(s, cfg, next(batches)) for _ in range(cfg.train.grad_accum)]
            s.lr_scheduler.step()
            if s.ema is not None:
                s.ema.step(s.params)
            step += 1
            loss, stop = self.loss_and_stop(losses)
            if not math.isfinite(loss):
                raise TrainingError(f"the loss became {loss} at step {step}; lower "
                                    "train.learning_rate or use mixed_precision = \"bf16\"")
            self.reporter.step(step, loss, s.lr_scheduler.get_last_lr()[0], s.sampler.epoch)
            if step == start_step + 1:
                self.reporter.memory(s.memory.snapshot("first_step"))
            if stop:
                self.reporter.status("stopping", step=step)
                self.finish(step)
                return "stopped"
            self.periodic(step, final=step == cfg.train.max_steps)
        self.finish(step)
        return "done"

    def finish(self, step: int) -> None:
        """The last checkpoint (the raw weights, which a resume continues from), then the
        weights users load: the EMA average when EMA is on, on a stop as on completion."""
        self.checkpoint(step)
        if self.s.ema is not None:
            self.s.ema.copy_to(self.s.params)
        self.save_weights()
        self.reporter.memory(self.s.memory.snapshot("peak"))


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


def _gather(obj: Any) -> list[Any]:
    """Every process's `obj`, in rank order (just [obj] without a process group)."""
    from accelerate.utils import gather_object

    return list(gather_object([obj]))


def _with_denoiser(components: Components, denoiser: Any) -> Components:
    import dataclasses

    return dataclasses.replace(components, denoiser=denoiser)


def _unwrapped(components: Components) -> Components:
    """The components with the plain modules under accelerate's wrappers (the denoiser
    and trained text encoders), for eval, validation and saving."""
    import dataclasses

    return dataclasses.replace(components, denoiser=unwrap(components.denoiser),
                               text_encoders=[None if e is None else unwrap(e)
                                              for e in components.text_encoders])


__all__ = ["Loop", "restore"]

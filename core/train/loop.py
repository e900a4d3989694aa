"""The training loop: optimizer steps, eval, validation, checkpoints, a clean stop."""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import Config, prompt_text
from core.memory.advice import out_of_memory_becomes
from core.models.adapters import lycoris_only_note
from core.models.modules import unwrap
from core.models.training_adapter import adapters_taken_out
from core.runs.folder import RunFolder
from core.train.checkpoint import TrainState, save_checkpoint
from core.train.compiling import eager
from core.train.evaluation import EvalSet, build_eval_set, evaluate
from core.train.grid import write_validation_grid
from core.train.optimizers import averaged_weights
from core.train.report import Reporter
from core.train.resume import trainable_state
from core.train.saves import ema_weights, epoch_save_due, save_lora_step
from core.train.setup import Setup, TrainingError
from core.train.stepping import PendingSteps, log_interval, micro_step
from core.train.texts import batch_encoder
from core.train.validation import encode_validation_prompts, generate_validation_images

if TYPE_CHECKING:
    from core.models.base import Components


class Loop:
    def __init__(self, setup: Setup, cfg: Config, run_dir: Path, reporter: Reporter,
                 stop: Any) -> None:
        self.s, self.cfg, self.run_dir = setup, cfg, run_dir
        self.reporter, self.stop = reporter, stop
        self.eval_set: EvalSet | None = None
        self.last_saved_step = -1
        self.last_lora_step = -1
        self.measured_rounds: set[str] = set()
        self.compiled = setup.compiled  # train.compile's watch, or None
        # An image-to-video model: validation.control_images are its first images (read
        # once: the answer may read the model folder's model_index.json).
        spec = setup.family.first_image
        self.first_image = bool(spec and spec.takes_first_image(cfg.model))

    @property
    def acc(self) -> Any:
        return self.s.accelerator

    @property
    def sharded(self) -> bool:
        """FSDP: every forward all-gathers, so every process evaluates and validates."""
        return self.s.sharded_class is not None

    @property
    def computes(self) -> bool:
        """Whether this process runs eval and validation (only the main one reports)."""
        return self.acc.is_main_process or self.sharded

    def out_of_memory_in(self, part: str, step: int) -> Any:
        """torch's out-of-memory error in `part` of the run becomes a refusal that says
        where and which settings would need less."""
        return out_of_memory_becomes(TrainingError, self.cfg, part, step)

    @contextlib.contextmanager
    def memory_of(self, phase: str, runs: bool = True) -> Iterator[None]:
        """The launch's first eval, validation round or checkpoint that `runs` gets a
        `memory` event of its own (ROUND_PHASES), measured apart from the steps before."""
        if not runs or phase in self.measured_rounds:
            yield
            return
        self.measured_rounds.add(phase)
        self.s.memory.close_interval()
        yield
        self.reporter.memory(self.s.memory.snapshot(phase))

    def eval(self, step: int) -> None:
        with self.memory_of("eval", self.eval_set is not None), \
                self.out_of_memory_in("eval", step), eager(self.compiled):
            self._eval(step)

    def _eval(self, step: int) -> None:
        started = time.monotonic()
        if self.computes and self.eval_set is not None:
            unwrapped = _unwrapped(self.s.components)
            # A trained text encoder re-encodes the eval captions as it is now.
            text = batch_encoder(self.s.family, unwrapped) if self.s.trained_encoders else None
            with self.averaged(), self.acc.autocast():
                result = evaluate(self.s.family, unwrapped, self.eval_set, self.acc.device,
                                  self.s.weight_dtype, text)
            if self.acc.is_main_process:
                self.reporter.eval(step, result, _since(started))
        self.acc.wait_for_everyone()
        if self.eval_set is not None:
            self.reporter.took("eval", time.monotonic() - started)

    def validate(self, step: int) -> None:
        with self.memory_of("validation", bool(self.cfg.validation.prompts)), \
                self.out_of_memory_in("validation", step), eager(self.compiled):
            self._validate(step)

    def _validate(self, step: int) -> None:
        started = time.monotonic()
        if self.computes and self.cfg.validation.prompts:
            # The pipeline runs in the denoiser's dtype, from the prompts encoded up front,
            # or encoded now by the text encoders a LoRA trains.
            texts = self.s.validation_texts
            if self.s.trained_encoders:
                texts = encode_validation_prompts(self.s.family,
                                                  _unwrapped(self.s.components),
                                                  self.cfg.validation)
            first_image = self.first_image
            with self.averaged(), _images_folder(self.run_dir,
                                                 self.acc.is_main_process) as folder, \
                    adapters_taken_out(self.s.components.denoiser,
                                       self.cfg.model.training_adapter,
                                       self.cfg.validation.with_training_adapter):
                paths = generate_validation_images(self.s.family, self.s.components,
                                                   self.cfg.validation, folder, step,
                                                   self.acc.device, texts, first_image)
            if self.acc.is_main_process:
                labels = [prompt_text(p) for p in self.cfg.validation.prompts]
                self.reporter.validation(step, paths, labels, _since(started))
                write_validation_grid(self.run_dir, labels,
                                      self.cfg.validation.control_images
                                      if self.s.family.edit or first_image
                                      else None)
        self.acc.wait_for_everyone()
        if self.cfg.validation.prompts:
            self.reporter.took("validation", time.monotonic() - started)

    def checkpoint(self, step: int) -> None:
        if step != self.last_saved_step:
            with self.memory_of("checkpoint"), self.out_of_memory_in("checkpoint", step):
                self._checkpoint(step)

    def _checkpoint(self, step: int) -> None:
        started = time.monotonic()
        state = TrainState(step=step, epoch=self.s.sampler.epoch,
                           sampler=self.s.sampler.state_dict())
        trainable, optimizer = self.checkpoint_states()
        folder = save_checkpoint(
            self.run_dir, step, self.acc.process_index, self.acc.wait_for_everyone,
            gather=_gather, trainable=trainable, optimizer=optimizer,
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

    def checkpoint_states(self) -> tuple[dict[str, Any], Any]:
        """The trained weights and the optimizer to save; sharded, their full states
        gathered to the main process (every process takes part)."""
        if not self.sharded:
            return trainable_state(self.s), self.s.optimizer
        from core.train.sharding import Frozen, full_optimizer_state, full_state

        model = self.s.components.denoiser
        return full_state(model), Frozen(full_optimizer_state(model, self.s.optimizer))

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
            with ema_weights(self.s.ema, self.s.params), self.averaged():
                files = save_lora_step(self.run_dir, step, self.write_lora)
            self.reporter.lora_saved(step, files)
        self.acc.wait_for_everyone()

    def averaged(self) -> Any:
        """A schedule-free optimizer's averaged weights for the duration (eval,
        validation, every save), its training weights bit for bit after; a no-op for
        other optimizers (core/train/optimizers.py)."""
        return averaged_weights(self.s.optimizer, self.s.params)

    def save_weights(self) -> None:
        """The trained LoRA (diffusers + kohya formats) or the full model; a schedule-free
        optimizer's averaged weights, gathered first when the model is sharded."""
        with self.averaged():
            denoiser = self.s.base_denoiser
            if self.sharded:  # gathered by every process; saved from a plain copy
                from core.train.sharding import full_state, unsharded_copy

                state = full_state(denoiser)
                if self.acc.is_main_process:
                    denoiser = unsharded_copy(self.s.sharded_class, denoiser, state)
            if self.acc.is_main_process:
                self._save_weights(denoiser)
        self.acc.wait_for_everyone()

    def _save_weights(self, denoiser: Any) -> None:
        comps = _with_denoiser(_unwrapped(self.s.components), denoiser)
        if self.cfg.train.method == "lora":
            files = self.write_lora(RunFolder(self.run_dir).lora)
            self.reporter.say("LoRA saved: " + ", ".join(str(p) for p in files.values()))
            if "diffusers" not in files:
                self.reporter.say(f"note: {lycoris_only_note()}")
        else:
            pipe = self.s.family.validation_pipeline(comps)
            model_dir = RunFolder(self.run_dir).model
            pipe.save_pretrained(str(model_dir), safe_serialization=True)
            self.reporter.say(f"model saved: {model_dir}")

    def rounds_due(self, step: int, final: bool) -> list[str]:
        """The rounds `periodic` runs after `step`."""
        cfg, sampler = self.cfg, self.s.sampler
        due = []
        if final or step % cfg.train.eval_every == 0:
            due.append("eval")
        if final or step % cfg.validation.every == 0:
            due.append("validation")
        if not final and step % cfg.train.checkpoint_every == 0:
            due.append("checkpoint")
        if not final and epoch_save_due(cfg.train.save_every_epochs, sampler.epoch,
                                        sampler.epoch_complete):
            due.append("lora_save")
        return due

    def periodic(self, step: int, final: bool) -> None:
        # Each round tells the reporter its time (`took`): kept out of it/s, counted in
        # the ETA.
        for kind in self.rounds_due(step, final):
            if kind == "eval":
                self.eval(step)
            elif kind == "validation":
                self.validate(step)
            elif kind == "checkpoint":
                self.checkpoint(step)
            else:
                started = time.monotonic()  # the last step's save comes with its checkpoint
                self.save_lora_step(step)
                self.reporter.took("lora_save", time.monotonic() - started)

    def report_steps(self, pending: PendingSteps, start_step: int, started: float) -> bool:
        """Read the pending steps' losses (the one wait for the device between rounds)
        and report them; returns whether to stop. The launch's first step also reports
        the start-up, its memory and, compiling, how long it took."""
        rows, stop = pending.read(self.acc, self.stop)
        for step, loss, _, _ in rows:
            if not math.isfinite(loss):
                raise TrainingError(f"the loss became {loss} at step {step}; lower "
                                    "train.learning_rate or use mixed_precision = \"bf16\"")
        first = rows[0][0] == start_step + 1
        if self.compiled is not None and not first:  # a recompile is not step time
            self.reporter.took("compile", self.compiled.news(rows[-1][0], self.reporter))
        self.reporter.steps(rows)
        if first:
            self.reporter.started()
            self.reporter.memory(self.s.memory.snapshot("first_step"))
            if self.compiled is not None:
                self.compiled.news(start_step + 1, self.reporter, time.monotonic() - started)
        return stop

    def run(self, start_step: int) -> str:
        """Train to max_steps; returns the final state: done or stopped."""

        cfg, s = self.cfg, self.s
        self.eval_set = build_eval_set(s.family, s.components, s.datasets,
                                       cfg.train.eval_images, cfg.train.batch_size,
                                       lambda items: s.texts.fill(_unwrapped(s.components),
                                                                  items))
        self.reporter.phase_done("eval_set")
        if start_step == 0 and cfg.train.eval_before_training:
            self.eval(0)
            self.reporter.phase_done("eval")
        if start_step == 0 and cfg.validation.before_training:
            self.validate(0)
            self.reporter.phase_done("validation")
        batches = iter(s.sampler)
        step = start_step
        pending = PendingSteps(log_interval(cfg.train.log_every, self.acc.device))
        alone = self.acc.num_processes == 1  # a stop asked for here needs no collective
        started = time.monotonic()
        while step < cfg.train.max_steps:
            with self.out_of_memory_in("step", step + 1):
                losses = [micro_step(s, cfg, next(batches))
                          for _ in range(cfg.train.grad_accum)]
            s.lr_scheduler.step()
            if s.ema is not None:
                s.ema.step(s.params)
            step += 1
            if s.router is not None:  # train.token_routing: the step's routed tokens
                self.reporter.routed(step, s.router.take())
            pending.add(step, losses, s.lr_scheduler.get_last_lr()[0], s.sampler.epoch)
            final = step == cfg.train.max_steps
            rounds = self.rounds_due(step, final)
            if pending.due(step, step == start_step + 1,
                           bool(rounds) or final or (alone and self.stop.requested())):
                if self.report_steps(pending, start_step, started):
                    self.reporter.status("stopping", step=step)
                    self.finish(step)
                    return "stopped"
            if rounds:
                self.periodic(step, final)
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


@contextlib.contextmanager
def _images_folder(run_dir: Path, main: bool) -> Iterator[Path]:
    """Where this process writes validation images: the run folder on the main process,
    a scratch folder on the others (sharded runs draw on every process)."""
    if main:
        yield run_dir
        return
    with tempfile.TemporaryDirectory(prefix="validation-") as scratch:
        yield Path(scratch)


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


__all__ = ["Loop"]

"""The program `accelerate launch` runs for a training run.

    accelerate launch ... -m core.train.main --config RUN_DIR/config.toml --workspace W
        [--resume latest|STEP|PATH]

Writes status.json, events.jsonl, validation images, checkpoints and the LoRA into
output.dir. SIGINT, SIGTERM or a STOP file in the run folder: finish the step, save a
checkpoint and the weights, state `stopped`, exit 130. A second SIGINT stops at once.
Any error: state `failed`, the error in events.jsonl, exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import traceback
from pathlib import Path
from typing import Any

from core.exits import EXIT_FAILED, EXIT_INVALID, EXIT_STOPPED, exit_with
from core.runs.status import exit_code_for_state, stop_requested


class StopSignal:
    """SIGINT/SIGTERM and the STOP file ask for a clean stop at the next step boundary."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.signalled = False

    def install(self) -> StopSignal:
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.signalled and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signalled = True
        print(f"received {signal.Signals(signum).name}: stopping after this step "
              "(saving a checkpoint and the weights)", flush=True)

    def requested(self) -> bool:
        return self.signalled or stop_requested(self.run_dir)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the run's config.toml")
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--resume", help="latest, a step number or a checkpoint folder")
    return parser.parse_args(argv)


def make_accelerator(cfg: Any, trackers: list[Any] | None = None) -> Any:
    """The Accelerator, its process group's collectives waiting launch.timeout_minutes
    (a long validation or full-model save on rank 0 keeps the others in a barrier), with
    the run's trackers (core/train/trackers.py; started once the start step is known)."""
    from datetime import timedelta

    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    timeout = InitProcessGroupKwargs(timeout=timedelta(minutes=cfg.launch.timeout_minutes))
    # SDXL conditions on its first text encoder's penultimate layer, so a LoRA on that
    # encoder's last layer gets no gradient: DDP must be told to expect unused weights.
    ddp = DistributedDataParallelKwargs(find_unused_parameters=cfg.train.text_encoder_lora)
    from core.train import sharding

    plugin = sharding.make_plugin() if sharding.wanted(cfg) else None  # launch.distributed
    accelerator = Accelerator(mixed_precision=cfg.train.mixed_precision,
                              gradient_accumulation_steps=cfg.train.grad_accum,
                              cpu=cfg.launch.cpu, kwargs_handlers=[timeout, ddp],
                              log_with=trackers or None, project_dir=cfg.output.dir,
                              fsdp_plugin=plugin)
    if plugin is not None:
        sharding.enable_on_cpu(accelerator, plugin)
    return accelerator


def make_reporter(cfg: Any, accelerator: Any, run_dir: Path) -> Any:
    """Rank 0 reports into the run folder. On a multi-machine run the first process of
    every other machine reports into that machine's folder (its own status.json,
    events.jsonl and log lines, which its run manager follows); the rest keep quiet."""
    from core.runs.folder import RunFolder
    from core.train.report import Reporter

    machine = cfg.launch.machine_rank if cfg.launch.num_machines > 1 else 0
    every = {"eval": cfg.train.eval_every, "validation": cfg.validation.every,
             "checkpoint": cfg.train.checkpoint_every}
    if accelerator.is_main_process or machine == 0:
        return Reporter(run_dir, accelerator.is_main_process, cfg.train.max_steps, every)
    folder = RunFolder(run_dir).machine(machine)
    return Reporter(folder.root, accelerator.is_local_main_process, cfg.train.max_steps,
                    every)


def check_ranks(cfg: Any, accelerator: Any, reporter: Any) -> None:
    """Before loading anything: the process group, the shared folders, one config."""
    from core.train.agreement import (
        check_same_config,
        check_shared_folders,
        describe_group,
        ranks_of,
    )

    if accelerator.num_processes == 1:
        return
    reporter.say(describe_group(accelerator, cfg))
    ranks = ranks_of(accelerator, cfg)
    if cfg.launch.num_machines > 1:
        check_shared_folders(cfg, ranks)
    check_same_config(cfg, ranks)


def run(args: argparse.Namespace, own_process: bool = False) -> int:
    """Train; `own_process` (the program `accelerate launch` runs, not a test calling
    main in its own process) also leaves out optional libraries the run does not use."""
    from core.config.optimizers import optimizer_package
    from core.libraries import leave_out_unused_libraries, loaded_outside_collections
    from core.notices import quiet_library_notices
    from core.startup import load_resolved_config
    from core.train import validation_model
    from core.train.startup_clock import StartupClock

    clock = StartupClock(own_process)
    quiet_library_notices()  # notices, not problems: keep train.log readable
    workspace = Path(args.workspace).absolute()
    cfg = load_resolved_config(Path(args.config), workspace)
    if cfg is None:
        return EXIT_INVALID
    validation_model.resolve(cfg, workspace)  # a tiny: validation.model, built once
    run_dir = Path(cfg.output.dir)
    stop = StopSignal(run_dir).install()
    if own_process:
        leave_out_unused_libraries(optimizer_package(cfg.train.optimizer), cfg.model.quantize)
    clock.mark("interpreter")
    with loaded_outside_collections() if own_process else contextlib.nullcontext():
        clock.import_libraries()
    from core.models.modules import avoid_cudnn_attention, cap_gpu_memory

    avoid_cudnn_attention()
    cap_gpu_memory()

    from accelerate.utils import set_seed

    from core.config.guidance_target import guidance_target_line
    from core.config.preserve import preserve_line
    from core.memory.advice import out_of_memory_text
    from core.models.modules import is_out_of_memory
    from core.train.agreement import RanksDisagree, check_same_start, ranks_of
    from core.train.loop import Loop
    from core.train.resume import restore
    from core.train.setup import TrainingError, build_setup
    from core.train.trackers import Tracking, make_trackers

    trackers, notes = make_trackers(cfg, run_dir)
    accelerator = make_accelerator(cfg, trackers)
    reporter = make_reporter(cfg, accelerator, run_dir)
    reporter.startup = clock
    for note in notes:
        reporter.say(note)
    reporter.status("starting", step=0, phase="loading",
                    processes=accelerator.num_processes)
    try:
        set_seed(cfg.train.seed, device_specific=True)
        check_ranks(cfg, accelerator, reporter)
        reporter.phase_done("accelerator")
        setup = build_setup(cfg, workspace, accelerator, reporter)
        if setup.sharded_class is not None:
            from core.train.sharding import describe

            reporter.say(describe(setup.components.denoiser, accelerator.num_processes))
        for line in (preserve_line(cfg), guidance_target_line(cfg)):  # their extra forward
            if line:
                reporter.say(line)
        reporter.phase_done("setup")
        start = restore(setup, run_dir, args.resume, reporter) if args.resume else 0
        if args.resume:
            reporter.phase_done("resume")
        if start:  # the ETA counts the rounds to come with the earlier launch's times
            reporter.continue_from()
        if accelerator.num_processes > 1:
            check_same_start(start, ranks_of(accelerator, cfg))
        reporter.tracking = Tracking(accelerator)
        reporter.tracking.start(start)
        reporter.status("running", step=start, phase="training")
        state = Loop(setup, cfg, run_dir, reporter, stop).run(start)
    except KeyboardInterrupt:
        reporter.event("error", message="stopped at once by a second interrupt; the last "
                                        "checkpoint is the one to resume from")
        reporter.status("stopped")
        return EXIT_STOPPED
    except Exception as exc:  # every failure is recorded for the UI, then reported
        if is_out_of_memory(exc):  # the loop names its own part; this is the setup's
            exc = TrainingError(out_of_memory_text(cfg, "setup", 0, str(exc)))
        if isinstance(exc, TrainingError):  # the user's to fix: the message, no traceback
            message = str(exc)
            if reporter.is_main or not isinstance(exc, RanksDisagree):  # said on every rank
                print(f"error: {message}", flush=True)
        else:
            traceback.print_exc()
            message = f"{type(exc).__name__}: {exc}"
        reporter.event("error", message=message)
        reporter.status("failed", reason=message)
        return EXIT_FAILED
    finally:
        if reporter.tracking is not None:
            reporter.tracking.end()
    reporter.status(state)
    reporter.say(f"training {state}: {run_dir}")
    return exit_code_for_state(state)


def main(argv: list[str] | None = None, own_process: bool = False) -> int:
    return run(parse_args(argv), own_process)


if __name__ == "__main__":
    exit_with(main(own_process=True))

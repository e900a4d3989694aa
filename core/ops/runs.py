"""Training runs: launch, resume, extend, stop, read their state, list and delete them.

A launch, a resume and a queued run starting all go through
`core.runs.launcher.start_accelerate`, the one place the accelerate command is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.check import CheckReport
from core.config import Config, load_config
from core.exits import EXIT_FAILED
from core.ops.checks import output_dir, require_ok
from core.ops.errors import OpError
from core.problems import ConfigError, Problem, error, warnings
from core.runs.folder import RunFolder

if TYPE_CHECKING:
    from core.runs.manager import RunHandle
    from core.runs.registry import RunInfo


@dataclass
class Launched:
    """A run started, or (`handle` None, `queued` its place) queued behind a live one."""

    handle: RunHandle | None
    command: str
    check_warnings: list[Problem] = field(default_factory=list)
    folder_notes: list[Problem] = field(default_factory=list)  # e.g. a resume's differences
    queued: int | None = None  # 1 = the next to start
    queued_dir: Path | None = None
    queued_behind: str = ""  # what it waits for, in words

    @property
    def warnings(self) -> list[Problem]:
        return self.check_warnings + self.folder_notes

    @property
    def run_dir(self) -> Path:
        return self.handle.run_dir if self.handle is not None else Path(self.queued_dir or "")

    @property
    def log_offset(self) -> int:
        if self.handle is not None:
            return self.handle.log_offset
        log = RunFolder(self.run_dir).log  # a queued resume: show only the coming launch
        return log.stat().st_size if log.exists() else 0


def saved_config(run_dir: Path) -> Config:
    """The config a run started with (its config.toml), which a resume keeps."""
    path = RunFolder(run_dir).config
    if not path.exists():
        raise OpError(f"{run_dir}: nothing to resume (no {path.name}); launch it instead",
                      [error("output.dir", f"{run_dir}: nothing to resume (no {path.name}); "
                                           "start it without --resume")])
    try:
        return load_config(path)
    except ConfigError as exc:
        raise OpError(f"cannot resume: {path} does not load", exc.problems) from None


def launch(cfg: Config, workspace: Path, *, resume: str | None = None,
           extra_problems: list[Problem] | None = None,
           checked: CheckReport | None = None, queue: bool = False) -> Launched:
    """Start training `cfg` into its output.dir, or (`resume`: "latest" or a checkpoint)
    continue the run there.

    A resume always runs with the run's saved config, launch layout included, whatever
    the caller's config says, except where this machine is and how it reaches machine 0
    (launch.machine_rank, main_process_ip, main_process_port: the caller's); settings
    that differ are returned as warnings. Machine N > 0 of a multi-machine run joins
    machine 0's run folder with a folder of its own (`machines/N/`), which its handle
    follows. `checked` skips the check when the caller just ran it on `cfg`.

    `queue` (the web UI): while a run of the workspace is live or others wait, the
    prepared run is queued instead (`Launched.queued`), and `start_next_queued` starts
    it later. A multi-machine run is never queued: its machines must start together.

    A resume of a `done` run is an extension (core/runs/extend.py): refused unless
    cfg.train.max_steps is larger than its final step (ops.resume, which keeps the
    saved max_steps, is always refused), else trained on to it.
    """
    from core.runs.queue import queue_lock

    what = "resuming" if resume else "the launch"
    report = require_ok(cfg, workspace, what, extra_problems, checked)
    run_dir = output_dir(cfg, workspace)
    if not queue or cfg.launch.num_machines > 1:
        return _start(cfg, workspace, run_dir, resume, report)
    with queue_lock(workspace):  # the monitor's check-then-start takes it too
        behind = _waiting_for(workspace)
        if not behind:
            return _start(cfg, workspace, run_dir, resume, report)
        from core.runs.queue import queue_run

        _, _, notes = _prepare_folder(cfg, run_dir, resume)
        place = queue_run(workspace, run_dir, resume)
        return Launched(None, "", warnings(report.problems) + memory_warning(report), notes,
                        queued=place,
                        queued_dir=run_dir, queued_behind=behind)


def _start(cfg: Config, workspace: Path, run_dir: Path, resume: str | None,
           report: CheckReport) -> Launched:
    from core.runs.launcher import start_accelerate
    from core.runs.manager import RunStartError

    launch_cfg, folder, notes = _prepare_folder(cfg, run_dir, resume)
    try:
        handle, command = start_accelerate(launch_cfg, folder, workspace, resume=resume)
    except RunStartError as exc:
        raise OpError(str(exc), exit_code=EXIT_FAILED) from None
    return Launched(handle, command, warnings(report.problems) + memory_warning(report), notes)


def memory_warning(report: CheckReport) -> list[Problem]:
    """The estimate's warning when the run needs more than the GPU has (the smallest
    model.blocks_to_swap that fits among its advice), said with the launch."""
    over = report.memory.over_the_card() if report.memory is not None else None
    return [over] if over is not None else []


def _waiting_for(workspace: Path) -> str:
    """What a new UI launch would wait for, in words ("" when it can start now): the
    workspace's live runs and the runs already queued."""
    from core.runs.queue import pending
    from core.runs.registry import list_runs as registry_runs

    live = [i for i in registry_runs(workspace) if i.alive]
    queued = pending(workspace)
    parts = [f"{i.run_dir} ({i.state})" for i in live]
    if queued:
        parts.append(f"{len(queued)} queued run(s)")
    return ", ".join(parts)


def _prepare_folder(cfg: Config, run_dir: Path, resume: str | None
                    ) -> tuple[Config, RunFolder, list[Problem]]:
    """(the config to launch, the folder the launch writes to, notes) or an OpError."""
    from core.runs.extend import extend_if_done
    from core.runs.prepare import (
        joins_a_run,
        prepare_machine_dir,
        prepare_run_dir,
        require_checkpoint,
        with_machine_keys,
    )

    try:
        if joins_a_run(cfg):
            launch_cfg, folder, notes = prepare_machine_dir(cfg, run_dir, bool(resume))
        else:
            if resume and RunFolder(run_dir).config.exists():  # else: nothing to resume
                require_checkpoint(run_dir, resume)  # before extending changes anything
            extended = extend_if_done(cfg, run_dir) if resume else []
            notes = extended + prepare_run_dir(cfg, run_dir, resume=bool(resume))
            folder = RunFolder(run_dir)
            launch_cfg = with_machine_keys(saved_config(run_dir), cfg) if resume else cfg
    except ConfigError as exc:
        lead = f"cannot {'resume' if resume else 'launch'}: "
        first = exc.problems[0] if exc.problems else None
        message = first.message if first else "the folder cannot be used"
        hint = first.hint.after(lead) if first and first.hint else None
        raise OpError(lead + message, exc.problems, hint=hint) from None
    return launch_cfg, folder, notes


def resume(run_dir: Path, workspace: Path, checkpoint: str = "latest", *,
           queue: bool = False) -> Launched:
    """Continue a run folder from a checkpoint with the config it was started with
    (`queue`: as `launch`'s)."""
    cfg = saved_config(run_dir)
    cfg.output.dir = str(run_dir)
    return launch(cfg, workspace, resume=checkpoint, queue=queue)


def extend(run_dir: Path, workspace: Path, max_steps: int, *,
           queue: bool = False) -> Launched:
    """Train a `done` run on from its final step to `max_steps` (larger than that step,
    else refused naming train.max_steps), keeping its final LoRA in lora/step_NNNNNN/.
    A run that is not done is refused: Resume continues it."""
    status = run_status_or_none(run_dir)
    if status != "done":
        raise OpError(f"{run_dir}: only a finished run (done) can be extended; it is "
                      f"{status or 'not started'}" + ("; use Resume" if status else ""),
                      [error("train.max_steps", "Extend needs a run whose state is done")])
    cfg = saved_config(run_dir)
    cfg.output.dir = str(run_dir)
    cfg.train.max_steps = int(max_steps)
    return launch(cfg, workspace, resume="latest", queue=queue)


def run_status_or_none(run_dir: Path) -> str | None:
    """A run folder's state from its status.json, None without one. Reads only."""
    from core.runs.status import read_status

    status = read_status(run_dir)
    return status.state if status is not None else None


def stop(run_dir: Path, grace_s: float, handle: RunHandle | None = None,
         workspace: Path | None = None) -> str:
    """Stop a run (the trainer saves first); its final state. A run found dead is
    recorded as failed; a queued run of `workspace`'s queue is cancelled (it never
    started)."""
    from core.runs.manager import stop_run
    from core.runs.queue import QueueError, cancel_queued, is_queued

    folder = _run_folder(run_dir)
    if workspace is not None and is_queued(folder.root):
        try:
            cancel_queued(workspace, folder.root)
            return "cancelled"
        except QueueError:  # it started meanwhile: stop it as any run
            pass
    return stop_run(folder, grace_s=grace_s, handle=handle).state


def run_status(run_dir: Path) -> RunInfo:
    """A run's state, progress and failure message. Reads only."""
    from core.runs.registry import run_info

    return run_info(_run_folder(run_dir).root)


def _run_folder(run_dir: Path) -> RunFolder:
    """The folder of a run that was started (it has a status.json), or an OpError."""
    folder = RunFolder(run_dir)
    if not folder.status.exists():
        raise OpError(f"{run_dir}: no run here (no {folder.status.name})")
    return folder


def list_runs(workspace: Path) -> list[RunInfo]:
    """Every run of the workspace, newest first. Reads only."""
    from core.runs.registry import list_runs as registry_runs

    return registry_runs(workspace)


def reconcile_runs(workspace: Path) -> list[RunInfo]:
    """`list_runs`, recording each run whose processes died unnoticed as failed."""
    from core.runs.registry import reconcile_runs as reconcile

    return reconcile(workspace)


def delete_run(run_dir: Path, workspace: Path, *, confirm: bool) -> Path:
    """Delete a run folder that is not live, with its registry record and queue entry,
    only when `confirm`; returns the folder deleted."""
    from core.runs.queue import load_queue, queue_lock, save_queue, without
    from core.runs.remove import DeleteRefused
    from core.runs.remove import delete_run as delete

    with queue_lock(workspace):  # the monitor must not start it while it goes
        try:
            path = delete(workspace, run_dir, confirm=confirm)
        except DeleteRefused as exc:
            raise OpError(str(exc)) from None
        save_queue(workspace, without(load_queue(workspace), path))
    return path

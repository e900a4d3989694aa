"""The actions of the tool, one set for both front ends.

`python app.py --no-ui` (core/headless.py) and the web UI (ui/actions.py, behind its
buttons and API endpoints) call these and nothing below them, so a click, an API call
and a command line do the same thing: check, prepare the demo data, build the caches,
caption the images, launch or resume a run, stop it, read its status, list the runs.

Refusals raise `OpError`: a message for a person, the problems behind it (each naming a
key or a path) and the CLI exit code it maps to. Nothing here prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.check import CheckReport, run_check
from core.config import Config, apply_overrides, load_config, resolved
from core.exits import EXIT_FAILED, EXIT_INVALID
from core.presets import list_presets, preset_path
from core.problems import ConfigError, Problem, blocking, error, errors, warnings
from core.runs.folder import RunFolder

if TYPE_CHECKING:
    from core.cache.job import CacheJob
    from core.caption.job import CaptionJob
    from core.runs.manager import RunHandle
    from core.runs.registry import RunInfo


class OpError(Exception):
    """An action was refused or could not start; nothing was left half done."""

    def __init__(self, message: str, problems: list[Problem] | None = None,
                 exit_code: int = EXIT_INVALID):
        self.message = message
        self.problems = problems or []
        self.exit_code = exit_code
        super().__init__(message + "".join(f"\n{p}" for p in self.problems))


# ---------------------------------------------------------------- configs and checks


def load_run_config(config: str | None, preset: str | None, overrides: list[str]) -> Config:
    """The config of `--config FILE` or `--preset NAME`, with `--set` overrides applied."""
    if not config and not preset:
        raise OpError("no config given", [error("--config", "give --config FILE or --preset "
                                                            "NAME (e.g. --preset demo)")])
    path = Path(config) if config else preset_path(preset or "")
    if preset and not path.exists():
        raise OpError(f"no preset named {preset!r}", [error("--preset", (
            f"no preset named {preset!r}; choose one of {', '.join(list_presets())} "
            "or give a path"))])
    try:
        return apply_overrides(load_config(path), overrides)
    except ConfigError as exc:
        raise OpError(f"{path} is not a valid config", exc.problems) from None


def require_workspace(workspace: Path) -> None:
    """Refuse a `--workspace` that is a file (or lies under one) before anything reads
    or writes below it: every path of the config would then fail on its own, naming a
    dataset rather than the workspace. A missing folder is fine: it is created."""
    for place in (workspace, *workspace.parents):
        if place.is_dir():
            return
        if place.exists():
            what = "is a file" if place == workspace else f"lies under a file ({place})"
            message = f"{workspace} {what}, not a folder; give a folder (it is created " \
                      "when missing)"
            raise OpError(f"workspace {workspace} is not a folder",
                          [error("--workspace", message)])


def output_dir(cfg: Config, workspace: Path) -> Path:
    return Path(resolved(cfg, workspace).output.dir)


def check(cfg: Config, workspace: Path, extra_problems: list[Problem] | None = None,
          estimate: bool = True) -> CheckReport:
    """`--stage check`: changes nothing. `extra_problems` (the form's) come first;
    `estimate`: with the memory estimate."""
    report = run_check(cfg, workspace, estimate)
    report.problems[:0] = extra_problems or []
    return report


def require_ok(cfg: Config, workspace: Path, what: str,
               extra_problems: list[Problem] | None = None,
               checked: CheckReport | None = None) -> CheckReport:
    """The check (or `checked`, when the caller just ran it), raising when it finds
    errors: errors block `what`, warnings do not."""
    report = checked or check(cfg, workspace, extra_problems)
    found = errors(report.problems)
    if found:
        them = "it" if len(found) == 1 else "them"
        raise OpError(f"{blocking(len(found), what)}; fix {them} first", found)
    return report


# ---------------------------------------------------------------- the demo


def prepare_demo(cfg: Config, workspace: Path, *, new_output: bool) -> list[str]:
    """The demo preset brings its own images: generate them once into the workspace.

    With `new_output`, a demo never refuses to run again: an output folder that holds a
    run gets a free `-N` sibling (cfg is changed). Returns notes for the user.
    """
    from core.data.synthetic import generate_demo_dataset

    folder = Path(resolved(cfg, workspace).datasets[0].images)
    try:
        count = generate_demo_dataset(folder)
    except FileExistsError as exc:
        raise OpError(str(exc), [error("datasets.0.images", str(exc))]) from None
    notes = [f"demo images: {count}, with captions, in {folder}"]
    if new_output:
        base = cfg.output.dir.rstrip("/")
        candidate, n = base, 2
        while RunFolder(workspace / candidate).config.exists():
            candidate, n = f"{base}-{n}", n + 1
        if candidate != base:
            notes.append(f"{workspace / base} holds an earlier demo run; this one goes to "
                         f"{workspace / candidate}")
        cfg.output.dir = candidate
    return notes


# ---------------------------------------------------------------- caches


def start_cache(cfg: Config, workspace: Path, *, running: CacheJob | None = None,
                extra_problems: list[Problem] | None = None,
                checked: CheckReport | None = None) -> CacheJob:
    """Start a cache build under the run manager; returns at once (follow its handle).

    `running` is the caller's current build: one at a time. `checked` skips the check
    when the caller just ran it.
    """
    from core.cache.job import start_cache_job
    from core.runs.manager import RunStartError

    if running is not None and running.poll() is None:
        raise OpError(f"a cache build is already running (log: {running.log_path}); wait "
                      "for it or stop it")
    require_ok(cfg, workspace, "the cache build", extra_problems, checked)
    try:
        return start_cache_job(cfg, workspace)
    except RunStartError as exc:
        raise OpError(str(exc), exit_code=EXIT_FAILED) from None


# ---------------------------------------------------------------- auto-captioning


def caption_config(cfg: Config, dataset_ids: list[str] | None = None) -> Config:
    """`cfg` with `captioning.datasets` replaced by `dataset_ids` when given (the UI's
    selected dataset); `cfg` itself is not changed."""
    import dataclasses

    if dataset_ids is None:
        return cfg
    return dataclasses.replace(cfg, captioning=dataclasses.replace(
        cfg.captioning, datasets=list(dataset_ids)))


def check_captioning(cfg: Config, workspace: Path) -> list[Problem]:
    """The check `--stage caption` runs: the `[captioning]` keys and the datasets it
    writes to (not the diffusion model: captioning does not need it). Reads only."""
    from core.caption.plan import caption_problems

    return caption_problems(cfg, workspace)


def start_caption(cfg: Config, workspace: Path, *, running: CaptionJob | None = None,
                  extra_problems: list[Problem] | None = None) -> CaptionJob:
    """Start captioning under the run manager; returns at once (follow its handle).

    Errors of the check (`extra_problems`, the form's, first) refuse it, naming the key.
    `running` is the caller's current job: one at a time.
    """
    from core.caption.job import start_caption_job
    from core.runs.manager import RunStartError

    if running is not None and running.poll() is None:
        raise OpError(f"captioning is already running (log: {running.log_path}); wait for "
                      "it or stop it")
    found = errors([*(extra_problems or []), *check_captioning(cfg, workspace)])
    if found:
        raise OpError(blocking(len(found), "captioning"), found)
    try:
        return start_caption_job(cfg, workspace)
    except RunStartError as exc:
        raise OpError(str(exc), exit_code=EXIT_FAILED) from None


# ---------------------------------------------------------------- runs


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
        return Launched(None, "", warnings(report.problems), notes, queued=place,
                        queued_dir=run_dir, queued_behind=behind)


def _start(cfg: Config, workspace: Path, run_dir: Path, resume: str | None,
           report: CheckReport) -> Launched:
    from core.runs.command import build_accelerate_command, format_command
    from core.runs.manager import RunStartError, start_run

    launch_cfg, folder, notes = _prepare_folder(cfg, run_dir, resume)
    spec = build_accelerate_command(launch_cfg, run_dir, workspace, resume=resume,
                                    config=folder.config)
    try:
        handle = start_run(spec, folder)
    except RunStartError as exc:
        raise OpError(str(exc), exit_code=EXIT_FAILED) from None
    return Launched(handle, format_command(spec), warnings(report.problems), notes)


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
        message = exc.problems[0].message if exc.problems else "the folder cannot be used"
        raise OpError(f"cannot {'resume' if resume else 'launch'}: {message}",
                      exc.problems) from None
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


# ---------------------------------------------------------------- the run queue


def queued_runs(workspace: Path) -> list[Path]:
    """The queued runs in the order they will start. Reads only."""
    from core.runs.queue import pending

    return [Path(e.run_dir) for e in pending(workspace)]


def start_next_queued(workspace: Path) -> Launched | None:
    """Start the first queued run when no run of the workspace is live; None when there
    is nothing to start. The UI's monitor calls this every second (cheap when nothing is
    queued). A queued run that cannot start is recorded as failed, naming why, and the
    next one gets its turn at the next call."""
    from core.runs.queue import load_queue, pending, queue_lock, save_queue

    if not load_queue(workspace):
        return None
    with queue_lock(workspace):
        saved = load_queue(workspace)
        entries = pending(workspace)
        if entries != saved:  # drop what no longer says queued (cancelled, deleted)
            save_queue(workspace, entries)
        if not entries or any(i.alive for i in list_runs(workspace)):
            return None
        entry = entries[0]
        save_queue(workspace, entries[1:])
        return _start_queued(workspace, Path(entry.run_dir), entry.resume)


def _start_queued(workspace: Path, run_dir: Path, resume: str | None) -> Launched | None:
    from core.runs.command import build_accelerate_command, format_command
    from core.runs.manager import RunStartError, start_run
    from core.runs.status import append_event, read_status, write_status

    try:
        cfg = saved_config(run_dir)  # the config queued (a resume's: the run's own)
        spec = build_accelerate_command(cfg, run_dir, workspace, resume=resume)
        handle = start_run(spec, RunFolder(run_dir))
    except (OpError, RunStartError) as exc:
        status = read_status(run_dir)
        if status is not None and status.state == "queued":
            reason = f"the queued run could not start: {exc}"
            write_status(run_dir, state="failed", reason=reason, finalized_by="manager")
            append_event(run_dir, {"type": "error", "step": status.step, "message": reason})
        return None
    return Launched(handle, format_command(spec))


def cancel_queued(run_dir: Path, workspace: Path) -> None:
    """Take a queued run out of the queue: state `cancelled`; nothing is deleted."""
    from core.runs.queue import QueueError
    from core.runs.queue import cancel_queued as cancel

    try:
        cancel(workspace, run_dir)
    except QueueError as exc:
        raise OpError(str(exc)) from None


def move_queued(run_dir: Path, workspace: Path, delta: int) -> list[Path]:
    """Move a queued run `delta` places (-1: it starts sooner); the new order."""
    from core.runs.queue import QueueError
    from core.runs.queue import move_queued as move

    try:
        return [Path(e.run_dir) for e in move(workspace, run_dir, delta)]
    except QueueError as exc:
        raise OpError(str(exc)) from None


# ---------------------------------------------------------------- downloads, deleting


def run_downloads(run_dir: Path, workspace: Path) -> list[Path]:
    """The run's config.toml and LoRA files (final, then by step, newest first), each
    checked to lie inside the workspace (what the UI may serve)."""
    from core.runs.outputs import downloadable_files, inside

    try:
        return [inside(workspace, p) for p in downloadable_files(run_dir)]
    except ValueError as exc:
        raise OpError(str(exc)) from None


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


# ---------------------------------------------------------------- merging a LoRA


def merge_run(run_dir: Path, workspace: Path, lora_scale: float | None = None) -> Path:
    """Fuse the run's final LoRA into its base: `<run_dir>/merged/`, a diffusers folder
    (core/merge.py); `lora_scale` None uses the run's merge.lora_scale. Refuses (exit 2)
    a folder without a run or a final LoRA, a live run, and an existing merged/."""
    from core.merge import MergeRefused
    from core.merge import merge_run as merge

    try:
        return merge(Path(run_dir), workspace, lora_scale).folder
    except MergeRefused as exc:
        raise OpError(exc.problem.message, [exc.problem]) from None


def merge(cfg: Config, workspace: Path) -> Path:
    """`--stage merge`: the run in `cfg`'s output.dir, at `cfg`'s merge.lora_scale."""
    return merge_run(output_dir(cfg, workspace), workspace, cfg.merge.lora_scale)

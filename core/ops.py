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
from core.problems import ConfigError, Problem, error, errors, warnings
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
        raise OpError(f"{len(found)} error(s) block {what}; fix them first", found)
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
        raise OpError(f"{len(found)} error(s) block captioning", found)
    try:
        return start_caption_job(cfg, workspace)
    except RunStartError as exc:
        raise OpError(str(exc), exit_code=EXIT_FAILED) from None


# ---------------------------------------------------------------- runs


@dataclass
class Launched:
    handle: RunHandle
    command: str
    check_warnings: list[Problem] = field(default_factory=list)
    folder_notes: list[Problem] = field(default_factory=list)  # e.g. a resume's differences

    @property
    def warnings(self) -> list[Problem]:
        return self.check_warnings + self.folder_notes

    @property
    def run_dir(self) -> Path:
        return self.handle.run_dir

    @property
    def log_offset(self) -> int:
        return self.handle.log_offset


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
           checked: CheckReport | None = None) -> Launched:
    """Start training `cfg` into its output.dir, or (`resume`: "latest" or a checkpoint)
    continue the run there.

    A resume always runs with the run's saved config, launch layout included, whatever
    the caller's config says, except where this machine is and how it reaches machine 0
    (launch.machine_rank, main_process_ip, main_process_port: the caller's); settings
    that differ are returned as warnings. Machine N > 0 of a multi-machine run joins
    machine 0's run folder with a folder of its own (`machines/N/`), which its handle
    follows. `checked` skips the check when the caller just ran it on `cfg`.
    """
    from core.runs.command import build_accelerate_command, format_command
    from core.runs.manager import RunStartError, start_run

    what = "resuming" if resume else "the launch"
    report = require_ok(cfg, workspace, what, extra_problems, checked)
    run_dir = output_dir(cfg, workspace)
    launch_cfg, folder, notes = _prepare_folder(cfg, run_dir, resume)
    spec = build_accelerate_command(launch_cfg, run_dir, workspace, resume=resume,
                                    config=folder.config)
    try:
        handle = start_run(spec, folder)
    except RunStartError as exc:
        raise OpError(str(exc), exit_code=EXIT_FAILED) from None
    return Launched(handle, format_command(spec), warnings(report.problems), notes)


def _prepare_folder(cfg: Config, run_dir: Path, resume: str | None
                    ) -> tuple[Config, RunFolder, list[Problem]]:
    """(the config to launch, the folder the launch writes to, notes) or an OpError."""
    from core.runs.prepare import (
        joins_a_run,
        prepare_machine_dir,
        prepare_run_dir,
        with_machine_keys,
    )

    try:
        if joins_a_run(cfg):
            launch_cfg, folder, notes = prepare_machine_dir(cfg, run_dir, bool(resume))
        else:
            notes = prepare_run_dir(cfg, run_dir, resume=bool(resume))
            folder = RunFolder(run_dir)
            launch_cfg = with_machine_keys(saved_config(run_dir), cfg) if resume else cfg
    except ConfigError as exc:
        message = exc.problems[0].message if exc.problems else "the folder cannot be used"
        raise OpError(f"cannot {'resume' if resume else 'launch'}: {message}",
                      exc.problems) from None
    return launch_cfg, folder, notes


def resume(run_dir: Path, workspace: Path, checkpoint: str = "latest") -> Launched:
    """Continue a run folder from a checkpoint with the config it was started with."""
    cfg = saved_config(run_dir)
    cfg.output.dir = str(run_dir)
    return launch(cfg, workspace, resume=checkpoint)


def stop(run_dir: Path, grace_s: float, handle: RunHandle | None = None) -> str:
    """Stop a run (the trainer saves first); its final state. A run found dead is
    recorded as failed."""
    from core.runs.manager import stop_run

    return stop_run(_run_folder(run_dir), grace_s=grace_s, handle=handle).state


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

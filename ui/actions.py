"""What the buttons do, without gradio: the UI's events and its API endpoints both call
these, and they call the same `core` functions as `python app.py --no-ui`.

Refusals raise `ActionError` (a message for the user plus the problems behind it);
the UI turns it into a warning and a visible panel, the API into an error message.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from core.check import CheckReport, run_check
from core.config import Config, resolved
from core.problems import ConfigError, Problem, errors, warnings
from core.runs.status import COMMAND_FILE, CONFIG_FILE
from ui.context import AppContext

STOP_GRACE_S = 60.0


class ActionError(Exception):
    def __init__(self, message: str, problems: list[Problem] | None = None):
        self.message = message
        self.problems = problems or []
        super().__init__(message + "".join(f"\n{p}" for p in self.problems))


def check(ctx: AppContext, cfg: Config, form_problems: list[Problem] | None = None
          ) -> CheckReport:
    """`--stage check` on the form's config; form problems (an empty number) come first."""
    report = run_check(cfg, ctx.workspace)
    report.problems[:0] = form_problems or []
    return report


def require_ok(ctx: AppContext, cfg: Config, what: str,
               form_problems: list[Problem] | None = None) -> CheckReport:
    """Errors block `what`; warnings do not."""
    report = check(ctx, cfg, form_problems)
    found = errors(report.problems)
    if found:
        raise ActionError(f"{len(found)} error(s) block {what}; fix them first (the check "
                          "panel on the Dataset tab lists them)", found)
    return report


# ---------------------------------------------------------------- training runs


@dataclass
class Launched:
    run_dir: Path
    command: str
    warnings: list[Problem] = field(default_factory=list)
    log_offset: int = 0


def launch(ctx: AppContext, cfg: Config, resume: bool = False,
           form_problems: list[Problem] | None = None) -> Launched:
    """Check, prepare the output folder and start `accelerate launch` (as the CLI does)."""
    from core.runs.command import build_accelerate_command, format_command
    from core.runs.process import RunStartError, start_run
    from core.runs.rundir import prepare_run_dir

    report = require_ok(ctx, cfg, "resuming" if resume else "the launch", form_problems)
    run_dir = Path(resolved(cfg, ctx.workspace).output.dir)
    try:
        notes = prepare_run_dir(cfg, run_dir, resume=resume)
    except ConfigError as exc:
        raise ActionError(_rundir_message(exc.problems, resume), exc.problems) from None
    spec = build_accelerate_command(cfg, run_dir, ctx.workspace,
                                    resume="latest" if resume else None)
    try:
        handle = start_run(spec, run_dir)
    except RunStartError as exc:
        raise ActionError(str(exc)) from None
    ctx.track(handle)
    return Launched(run_dir, format_command(spec), warnings(report.problems) + notes,
                    handle.log_offset)


def output_dir(ctx: AppContext, cfg: Config) -> Path:
    return Path(resolved(cfg, ctx.workspace).output.dir)


def resume(ctx: AppContext, run_dir: str | Path) -> Launched:
    """Continue a run from its last checkpoint with the config it was started with."""
    from core.config import load_config

    run_dir = Path(run_dir)
    saved = run_dir / CONFIG_FILE
    if not saved.exists():
        raise ActionError(f"{run_dir}: nothing to resume (no {CONFIG_FILE}); launch it instead")
    try:
        cfg = load_config(saved)
    except ConfigError as exc:
        raise ActionError(f"cannot resume: {saved} does not load", exc.problems) from None
    cfg.output.dir = str(run_dir)
    return launch(ctx, cfg, resume=True)


def _rundir_message(problems: list[Problem], resume: bool) -> str:
    text = problems[0].message if problems else "the output folder cannot be used"
    text = text.replace("--set output.dir=", "Output folder = ")
    text = text.replace("with --resume", "with Resume")
    return f"cannot {'resume' if resume else 'launch'}: {text}"


def stop(ctx: AppContext, run_dir: str | Path, grace_s: float = STOP_GRACE_S) -> str:
    """Stop a run (the trainer saves first); returns its final state."""
    from core.runs.process import stop_run
    from core.runs.registry import run_info

    run_dir = Path(run_dir)
    if not (run_dir / "status.json").exists():
        raise ActionError(f"{run_dir}: no run here (no status.json)")
    with ctx.exclusive(run_dir):
        handle = ctx.handle(run_dir)
        if handle is None:
            return run_info(run_dir).state
        state = stop_run(run_dir, grace_s=grace_s, handle=handle).state
    ctx.forget(run_dir)
    return state


def reproduce_lines(ctx: AppContext, run_dir: Path) -> str:
    """Copyable commands: the exact command the run used, and the CLI equivalents."""
    ws = shlex.quote(str(ctx.workspace))
    config = shlex.quote(str(run_dir / CONFIG_FILE))
    python = shlex.quote(sys.executable)
    lines = []
    command = run_dir / COMMAND_FILE
    if command.exists():
        lines += ["# the exact command this run used (command.txt):",
                  command.read_text(encoding="utf-8").strip()]
    lines += ["# continue it from its last checkpoint:",
              f"{python} app.py --no-ui --config {config} --workspace {ws} --resume",
              "# the same config as a new run (pick a new output folder):",
              f"{python} app.py --no-ui --config {config} --workspace {ws} "
              f"--set output.dir={shlex.quote(ctx.relative(run_dir) + '-new')}"]
    return ctx.redact("\n".join(lines))


# ---------------------------------------------------------------- caches


def start_cache(ctx: AppContext, cfg: Config,
                form_problems: list[Problem] | None = None):
    """Start a cache build in the background (one at a time per app)."""
    from core.cache.job import start_cache_job

    job = ctx.cache_job
    if job is not None and job.poll() is None:
        raise ActionError(f"a cache build is already running (log: {job.log_path}); wait "
                          "for it or stop it")
    require_ok(ctx, cfg, "the cache build", form_problems)
    ctx.cache_job = start_cache_job(cfg, ctx.workspace)
    return ctx.cache_job


def stop_cache(ctx: AppContext) -> str:
    job = ctx.cache_job
    if job is None:
        raise ActionError("no cache build to stop")
    return job.stop()


def cache_status(ctx: AppContext, cfg: Config):
    from core.cache.status import cache_status as status

    return status(resolved(cfg, ctx.workspace), ctx.workspace)


def dataset_by_id(cfg: Config, dataset_id: str) -> int:
    for i, ds in enumerate(cfg.datasets):
        if ds.id == dataset_id:
            return i
    known = ", ".join(ds.id for ds in cfg.datasets) or "none"
    raise ActionError(f"no dataset with id {dataset_id!r} (datasets: {known})")


def cache_files(ctx: AppContext, cfg: Config, dataset_id: str):
    """What clearing would delete, for the confirmation."""
    from core.cache.clear import ClearRefused, find_cache_files

    full = resolved(cfg, ctx.workspace)
    try:
        return find_cache_files(full.datasets[dataset_by_id(cfg, dataset_id)], full)
    except ClearRefused as exc:
        raise ActionError(str(exc)) from None


def clear_cache(ctx: AppContext, cfg: Config, dataset_id: str):
    from core.cache.clear import ClearRefused, clear_dataset_cache

    job = ctx.cache_job
    if job is not None and job.poll() is None:
        raise ActionError("a cache build is running; stop it before clearing a cache")
    full = resolved(cfg, ctx.workspace)
    try:
        return clear_dataset_cache(full.datasets[dataset_by_id(cfg, dataset_id)], full)
    except ClearRefused as exc:
        raise ActionError(str(exc)) from None

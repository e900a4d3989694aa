"""API endpoints for scripts and tests (gradio_client), taking a config as TOML text.

They run the same `ui.actions` functions as the buttons, so a client call and a click
behave alike; refusals come back as errors whose message names the key and the path.
Run folders are accepted only when they belong to this workspace (its registry or the
workspace folder), so a client cannot stop or read arbitrary processes and files.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import gradio as gr

from core import ops
from core.config import loads_config
from core.ops import RunFolder, last_lines
from core.problems import ConfigError
from ui import actions
from ui.actions import ActionError
from ui.context import AppContext
from ui.errors import guarded


def _config(text: str):
    try:
        return loads_config(text, "config_toml")
    except ConfigError as exc:
        raise ActionError("the config does not load", exc.problems) from None


def _problem(p: Any) -> dict[str, str]:
    return {"level": p.level, "where": p.where, "message": p.message}


def _run_dir(ctx: AppContext, run_dir: str) -> Path:
    path = Path(run_dir).expanduser()
    path = (path if path.is_absolute() else ctx.workspace / path).resolve()
    known = {i.run_dir.resolve() for i in ops.list_runs(ctx.workspace)}
    if path not in known and not path.is_relative_to(ctx.workspace.resolve()):
        raise ActionError(f"{run_dir} is not a run of this workspace ({ctx.workspace})")
    return path


def run_status(ctx: AppContext, run_dir: Path, lines: int = 40) -> dict[str, Any]:
    with actions.refusals():
        info = ops.run_status(run_dir)
    folder = RunFolder(run_dir)
    images = [str(p) for p in folder.validation_images()]
    videos = [str(p) for p in ops.validation_videos(run_dir)]  # video families only
    log = [ctx.redact(line) for line in last_lines(folder.log, lines)]
    return {"run_dir": str(run_dir), "state": info.state, "alive": info.alive,
            "step": info.step, "max_steps": info.max_steps, "eta_s": info.eta_s,
            "it_s": info.status.it_s, "loss": info.status.loss, "reason": info.reason,
            "log": log, "images": images, "videos": videos}


def cache_job_view(ctx: AppContext) -> dict[str, Any]:
    job = ctx.cache_job
    if job is None:
        return {"state": "none"}
    state = job.poll()
    kinds = {k: {"done": p.done, "total": p.total, "eta_s": p.eta_s()}
             for k, p in job.progress.kinds.items()}
    return {"state": state or "running", "job_dir": str(job.job_dir), "progress": kinds,
            "log": [ctx.redact(line) for line in job.log_lines(40)]}


class Endpoints:
    """The endpoint functions; their type hints give the API its types."""

    names = ("check", "cache_status", "build_cache", "cache_progress", "clear_cache",
             "launch", "stop", "status", "runs")

    def __init__(self, ctx: AppContext):
        self.ctx = ctx

    def check(self, config_toml: str) -> dict:
        """--stage check on a config: every problem, then the summary lines."""
        report = actions.check(self.ctx, _config(config_toml))
        return {"ok": report.ok, "problems": [_problem(p) for p in report.problems],
                "lines": report.lines()}

    def cache_status(self, config_toml: str) -> list:
        """Per dataset: images, and VAE/text entries cached, stale and missing."""
        status = actions.cache_status(self.ctx, _config(config_toml))
        return [{"id": d.id, "images": d.images, "vae": vars(d.vae), "text": vars(d.text)}
                for d in status.datasets]

    def build_cache(self, config_toml: str, wait_s: float = 0.0) -> dict:
        """Start a cache build; wait up to wait_s seconds for it to end."""
        job = actions.start_cache(self.ctx, _config(config_toml))
        deadline = time.monotonic() + wait_s
        while job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        return cache_job_view(self.ctx)

    def cache_progress(self) -> dict:
        """The current (or last) cache build: state, progress per kind, log tail."""
        return cache_job_view(self.ctx)

    def clear_cache(self, config_toml: str, dataset_id: str) -> dict:
        """Delete one dataset's VAE cache files (never its images)."""
        done = actions.clear_cache(self.ctx, _config(config_toml), dataset_id)
        return {"folder": str(done.folder), "entries": done.entries,
                "files": len(done.files)}

    def launch(self, config_toml: str, resume: bool = False) -> dict:
        """Check, then start training (or resume output.dir from its last checkpoint); while
        another run is live it is queued instead ("queued": its place, 0 when started)."""
        launched = actions.launch(self.ctx, _config(config_toml), resume=resume)
        return {"run_dir": str(launched.run_dir), "command": self.ctx.redact(launched.command),
                "warnings": [_problem(p) for p in launched.warnings],
                "queued": launched.queued or 0}

    def stop(self, run_dir: str) -> dict:
        """Stop a run (the trainer saves a checkpoint first); its final state."""
        path = _run_dir(self.ctx, run_dir)
        return {"run_dir": str(path), "state": actions.stop(self.ctx, path)}

    def status(self, run_dir: str) -> dict:
        """State, step, ETA, the log's last lines and the validation images (and videos) of a
        run."""
        return run_status(self.ctx, _run_dir(self.ctx, run_dir))

    def runs(self) -> list:
        """Every run of the workspace, newest first."""
        return [{"run_dir": str(i.run_dir), "state": i.state, "alive": i.alive,
                 "step": i.step, "max_steps": i.max_steps}
                for i in ops.list_runs(self.ctx.workspace)]


def register(ctx: AppContext) -> None:
    """Add the endpoints (/check, /launch, ...) to the Blocks being built."""
    endpoints = Endpoints(ctx)
    for name in Endpoints.names:
        fn = guarded(name.replace("_", " "))(getattr(endpoints, name))
        gr.api(fn, api_name=name, concurrency_limit=None)

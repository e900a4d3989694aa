"""Prepare an output folder for a fresh run or a resume, never overwriting one silently."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.config import Config, config_to_dict, load_config, save_config
from core.problems import ConfigError, Problem, error, warning
from core.runs.folder import RunFolder
from core.runs.registry import run_is_alive
from core.runs.status import read_status


class RunDirError(ConfigError):
    """The output folder cannot be used as asked; carries one problem naming output.dir."""


def _next_free_name(cfg: Config, run_dir: Path) -> str:
    """`output.dir` as the user wrote it, with the first free `-N` suffix."""
    for n in range(2, 1000):
        if not (run_dir.parent / f"{run_dir.name}-{n}").exists():
            return f"{cfg.output.dir.rstrip('/')}-{n}"
    return f"{cfg.output.dir.rstrip('/')}-new"


def _describe(run_dir: Path) -> str:
    status = read_status(run_dir)
    if status is None or not status.state:
        return "it holds a run's config.toml"
    state, step, total = status.state, status.step, status.max_steps
    at = f" at step {step}" + (f"/{total}" if total else "") if step is not None else ""
    return f"it holds a run ({state}{at})"


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else key))
        return out
    if isinstance(data, list) and data and isinstance(data[0], dict):
        out = {}
        for i, value in enumerate(data):
            out.update(_flatten(value, f"{prefix}.{i}"))
        return out
    return {prefix: data}


def _resume_differences(cfg: Config, saved_path: Path) -> list[Problem]:
    """Warn about settings that differ from the run's saved config, which a resume uses."""
    try:
        saved = load_config(saved_path)
    except ConfigError as exc:
        raise RunDirError([error(str(saved_path), "cannot resume: the run's config does "
                                 f"not load: {exc.problems[0].message}")]) from None
    new, old = _flatten(config_to_dict(cfg)), _flatten(config_to_dict(saved))
    return [
        warning(key, f"is {new.get(key)!r} here but {old.get(key)!r} in {saved_path}; "
                     "the resumed run keeps its saved config")
        for key in sorted(set(new) | set(old))
        if new.get(key) != old.get(key) and key != "output.dir"
    ]


def prepare_run_dir(cfg: Config, run_dir: str | Path, resume: bool) -> list[Problem]:
    """Make `run_dir` ready to start a run; returns warnings, raises RunDirError.

    - A live run in the folder is always refused.
    - A folder that already holds a run (config.toml or status.json) is refused unless
      `resume`; the message says how to start elsewhere or resume.
    - Fresh start: writes config.toml (the exact config). Resume: keeps the saved
      config.toml (warning about every setting given that differs from it).
    """
    run_dir = Path(run_dir)
    folder = RunFolder(run_dir)
    status = read_status(run_dir)
    if status and run_is_alive(status):
        other = _next_free_name(cfg, run_dir)
        raise RunDirError([error("output.dir", (
            f"{run_dir}: a run is still going in this folder (pid {status.pid}); "
            f"stop it first, or start a new run with --set output.dir={other}"))])
    if resume:
        if not folder.config.exists():
            raise RunDirError([error("output.dir", f"{run_dir}: nothing to resume (no "
                                     f"{folder.config.name}); start it without --resume")])
        problems = _resume_differences(cfg, folder.config)
    elif folder.holds_run():
        raise RunDirError([error("output.dir", (
            f"{run_dir}: {_describe(run_dir)}; it is not overwritten. Start a new run in "
            f"another folder with --set output.dir={_next_free_name(cfg, run_dir)}, or "
            f"continue this one with --resume"))])
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, folder.config)
        problems = []
    folder.stop_file.unlink(missing_ok=True)
    return problems

"""Prepare an output folder for a fresh run or a resume, never overwriting one silently.

A multi-machine run has one run folder, on a filesystem every machine sees: machine 0
prepares it (config.toml, status.json, train.log) and the other machines join, each
with its own `machines/<rank>/` folder beside machine 0's files (`prepare_machine_dir`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from core.config import Config, config_to_dict, load_config, save_config
from core.problems import ConfigError, Hint, Problem, error, hinted, warning
from core.runs.folder import RunFolder
from core.runs.registry import run_is_alive
from core.runs.status import read_status


class RunDirError(ConfigError):
    """The output folder cannot be used as asked; carries one problem naming output.dir."""


# Where this machine is and how it reaches machine 0: every launch (a resume too) takes
# them from its own command line, never from the saved config, or every machine that
# resumes would claim rank 0.
PER_MACHINE_KEYS = ("launch.machine_rank", "launch.main_process_ip",
                    "launch.main_process_port")


def with_machine_keys(saved: Config, given: Config) -> Config:
    """`saved` (a run's config) with the PER_MACHINE_KEYS of `given` (this launch's)."""
    out = copy.deepcopy(saved)
    out.launch.machine_rank = given.launch.machine_rank
    out.launch.main_process_ip = given.launch.main_process_ip
    out.launch.main_process_port = given.launch.main_process_port
    return out


def joins_a_run(cfg: Config) -> bool:
    """True for machine N > 0 of a multi-machine run: it joins, machine 0 prepares."""
    return cfg.launch.num_machines > 1 and cfg.launch.machine_rank > 0


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


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """A config dict as dotted keys (`datasets.0.repeats`) -> values."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else key))
        return out
    if isinstance(data, list) and data and isinstance(data[0], dict):
        out = {}
        for i, value in enumerate(data):
            out.update(flatten(value, f"{prefix}.{i}"))
        return out
    return {prefix: data}


def _resume_differences(cfg: Config, saved_path: Path) -> list[Problem]:
    """Warn about settings that differ from the run's saved config, which a resume uses."""
    try:
        saved = load_config(saved_path)
    except ConfigError as exc:
        raise RunDirError([error(str(saved_path), "cannot resume: the run's config does "
                                 f"not load: {exc.problems[0].message}")]) from None
    new, old = flatten(config_to_dict(cfg)), flatten(config_to_dict(saved))
    return [
        warning(key, f"is {new.get(key)!r} here but {old.get(key)!r} in {saved_path}; "
                     "the resumed run keeps its saved config")
        for key in sorted(set(new) | set(old))
        if new.get(key) != old.get(key) and key != "output.dir"
        and key not in PER_MACHINE_KEYS
    ]


def require_checkpoint(run_dir: Path, which: str) -> None:
    """Refuse a resume whose checkpoint (`which`: "latest" or a name) the trainer would
    not find, before the folder is touched: the trainer finds out only after loading the
    model, and an extension would already have rewritten config.toml."""
    folder = RunFolder(run_dir)
    try:
        folder.find_checkpoint(which)  # the trainer's own lookup
    except FileNotFoundError as exc:
        have = [p.name for p in folder.checkpoint_folders()]
        hint = (f"; it has {', '.join(have)} (--resume without a name takes the latest)"
                if have else "")
        raise RunDirError([error("--resume", f"{exc}{hint}")]) from None


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
        raise RunDirError([hinted("output.dir", Hint(
            f"{run_dir}: a run is still going in this folder (pid {status.pid}); "
            "stop it first, or start a new run with {set}", "output.dir", other))])
    if resume:
        if not folder.config.exists():
            raise RunDirError([error("output.dir", f"{run_dir}: nothing to resume (no "
                                     f"{folder.config.name}); start it without --resume")])
        problems = _resume_differences(cfg, folder.config)
    elif folder.holds_run():
        raise RunDirError([hinted("output.dir", Hint(
            f"{run_dir}: {_describe(run_dir)}; it is not overwritten. Start a new run in "
            "another folder with {set}, or continue this one with {resume}", "output.dir",
            _next_free_name(cfg, run_dir)))])
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, folder.config)
        problems = []
    folder.stop_file.unlink(missing_ok=True)
    return problems


def prepare_machine_dir(cfg: Config, run_dir: str | Path, resume: bool
                        ) -> tuple[Config, RunFolder, list[Problem]]:
    """Machine N > 0 of a multi-machine run: (the config its trainer reads, its folder
    `machines/N/`, warnings); raises RunDirError.

    It never refuses because the run folder holds machine 0's run (machine 0 owns
    config.toml, status.json and the STOP file), and waits for machine 0 in the
    rendezvous rather than here. A fresh start runs `cfg` (the trainer checks that every
    machine's config agrees); a resume runs the run's saved config.toml, which every
    machine must see, with this machine's PER_MACHINE_KEYS.
    """
    rank = cfg.launch.machine_rank
    run_dir = Path(run_dir)
    folder = RunFolder(run_dir).machine(rank)
    status = read_status(folder.root)
    if status and run_is_alive(status):
        raise RunDirError([error("launch.machine_rank", (
            f"{folder.root}: machine {rank} of this run is still running on this machine "
            f"(pid {status.pid}); stop it first"))])
    problems: list[Problem] = []
    launch_cfg = cfg
    if resume:
        saved = RunFolder(run_dir).config
        if not saved.exists():
            raise RunDirError([error("output.dir", (
                f"{run_dir}: machine {rank} cannot see {saved.name}, which machine 0 wrote "
                "when the run started. The output folder must be on a filesystem every "
                "machine sees, at the same path; or, if the run never started, start it "
                "without --resume"))])
        problems = _resume_differences(cfg, saved)
        launch_cfg = with_machine_keys(load_config(saved), cfg)
    folder.root.mkdir(parents=True, exist_ok=True)
    save_config(launch_cfg, folder.config)
    folder.stop_file.unlink(missing_ok=True)
    return launch_cfg, folder, problems

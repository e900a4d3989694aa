"""`python app.py --no-ui`: check, cache and train from a config, printing progress.

Exit codes are the CLI contract: 0 done, 2 invalid config or datasets, 1 run failed,
130 stopped by the user.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core.config import Config, apply_overrides, load_config, resolved
from core.presets import is_demo, preset_path
from core.problems import ConfigError, error

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_STOPPED = 0, 1, 2, 130


def say(line: str) -> None:
    print(line, flush=True)


def load_run_config(config: str | None, preset: str | None, overrides: list[str]) -> Config:
    if not config and not preset:
        raise ConfigError([error("--config", "give --config FILE or --preset NAME "
                                                "(e.g. --preset demo)")])
    path = Path(config) if config else preset_path(preset or "")
    if preset and not path.exists():
        from core.presets import list_presets

        raise ConfigError([error("--preset", f"no preset named {preset!r}; choose one of "
                                                f"{', '.join(list_presets())} or give a path")])
    return apply_overrides(load_config(path), overrides)


def prepare_demo_data(cfg: Config, workspace: Path) -> None:
    """The demo preset brings its own images: generate them once into the workspace."""
    from core.data.synthetic import generate_demo_dataset

    folder = Path(resolved(cfg, workspace).datasets[0].images)
    try:
        count = generate_demo_dataset(folder)
    except FileExistsError as exc:
        raise ConfigError([error("datasets.0.images", str(exc))]) from None
    say(f"demo dataset: {count} images with captions in {folder}")


def stage_check(cfg: Config, workspace: Path) -> int:
    from core.check import run_check

    report = run_check(cfg, workspace)
    for line in report.lines():
        say(line)
    return EXIT_OK if report.ok else EXIT_INVALID


def summarize_run(run_dir: Path, state: str, workspace: Path) -> None:
    say(f"run {state}: {run_dir}")
    lora = run_dir / "lora" / "pytorch_lora_weights.safetensors"
    if lora.exists():
        say(f"LoRA: {lora}")
    validation = sorted((run_dir / "validation").glob("step_*"))
    if validation:
        say(f"validation images: {validation[-1]}")
    if state in ("stopped", "failed"):
        # The saved config's relative paths resolve against this run's workspace.
        say(f"resume with: python app.py --no-ui --workspace {workspace} "
            f"--config {run_dir / 'config.toml'} --resume")


def stage_train(cfg: Config, workspace: Path, resume: str | None) -> int:
    """Start the trainer under accelerate launch (it builds missing cache entries first)."""
    from core.runs.command import build_accelerate_command
    from core.runs.foreground import follow_run
    from core.runs.process import RunStartError, start_run
    from core.runs.rundir import prepare_run_dir
    from core.runs.status import exit_code_for_state

    run_dir = Path(resolved(cfg, workspace).output.dir)
    try:
        for problem in prepare_run_dir(cfg, run_dir, resume=bool(resume)):
            say(str(problem))
        # A resumed run keeps its saved config (the trainer reads it), launch layout too.
        launch_cfg = load_config(run_dir / "config.toml") if resume else cfg
        spec = build_accelerate_command(launch_cfg, run_dir, workspace, resume=resume)
        handle = start_run(spec, run_dir)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr, flush=True)
        return EXIT_INVALID
    except RunStartError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    say(f"== train: {run_dir} (log: {run_dir / 'train.log'})")
    state = follow_run(handle, say, grace_s=120.0)
    summarize_run(run_dir, state, workspace)
    return exit_code_for_state(state)


def stage_cache(cfg: Config, workspace: Path) -> int:
    """Build the caches under accelerate launch, with the run's process layout."""
    import os
    import subprocess
    import tempfile

    from core.config import save_config
    from core.runs.command import build_accelerate_command

    folder = workspace / ".tmp"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        save_config(cfg, Path(tmp) / "config.toml")
        spec = build_accelerate_command(cfg, Path(tmp), workspace, resume=None,
                                        script=["--module", "core.cache.main"])
        say("== cache")
        try:
            done = subprocess.run(spec.argv, cwd=spec.cwd, env={**os.environ, **spec.env})
        except KeyboardInterrupt:  # the child got the same Ctrl-C; finished entries stay
            say("cache build stopped; entries written so far are kept")
            return EXIT_STOPPED
    return {0: EXIT_OK, 2: EXIT_INVALID}.get(done.returncode, EXIT_FAILED)


def demo_output_dir(cfg: Config, workspace: Path) -> None:
    """The demo never refuses to run again: a used demo folder gets a -N sibling."""
    base = cfg.output.dir.rstrip("/")
    candidate, n = base, 2
    while (workspace / candidate / "config.toml").exists():
        candidate, n = f"{base}-{n}", n + 1
    if candidate != base:
        say(f"{workspace / base} holds an earlier demo run; this one goes to "
            f"{workspace / candidate}")
    cfg.output.dir = candidate


def run_headless(args: argparse.Namespace) -> int:
    workspace = Path(args.workspace).expanduser().absolute()
    try:
        cfg = load_run_config(args.config, args.preset, args.overrides)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr, flush=True)
        return EXIT_INVALID
    if is_demo(args.preset) and args.stage != "check":
        try:
            prepare_demo_data(cfg, workspace)
        except ConfigError as exc:
            for problem in exc.problems:
                print(problem, file=sys.stderr, flush=True)
            return EXIT_INVALID
        if not args.resume:
            demo_output_dir(cfg, workspace)
    say("== check")
    code = stage_check(cfg, workspace)
    if code != EXIT_OK or args.stage == "check":
        return code
    if args.stage == "cache":
        return stage_cache(cfg, workspace)
    return stage_train(cfg, workspace, args.resume)

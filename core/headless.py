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
    count = generate_demo_dataset(folder, size=cfg.datasets[0].resolution)
    say(f"demo dataset: {count} images with captions in {folder}")


def stage_check(cfg: Config, workspace: Path) -> int:
    from core.check import run_check

    report = run_check(cfg, workspace)
    for line in report.lines():
        say(line)
    return EXIT_OK if report.ok else EXIT_INVALID


def run_headless(args: argparse.Namespace) -> int:
    workspace = Path(args.workspace).expanduser().absolute()
    try:
        cfg = load_run_config(args.config, args.preset, args.overrides)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr, flush=True)
        return EXIT_INVALID
    if is_demo(args.preset) and args.stage != "check":
        prepare_demo_data(cfg, workspace)
    say("== check")
    code = stage_check(cfg, workspace)
    if code != EXIT_OK or args.stage == "check":
        return code
    say("The cache and train stages are not built yet; stopping after the check stage.")
    return EXIT_OK

"""Configs and checks: load a run's config, refuse a bad workspace, run the check (and
the model-source check and memory estimate the Training tab shows)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.check import CheckReport, run_check
from core.config import Config, apply_overrides, load_config, resolved
from core.memory.fit import FIT_KEYS, FitPlan
from core.ops.errors import OpError
from core.presets import PRESETS_DIR, gated_note, is_demo, list_presets, preset_path
from core.problems import ConfigError, Hint, Problem, blocking, error, errors

if TYPE_CHECKING:
    from core.memory.estimate import MemoryEstimate

__all__ = ["FIT_KEYS", "PRESETS_DIR", "CheckReport", "FitPlan", "check", "check_model_source",
           "estimate_memory",
           "gated_note", "is_demo", "list_presets", "load_run_config", "output_dir",
           "require_ok", "require_workspace"]


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
        hint = Hint(f"{blocking(len(found), what)}; fix {them} first{{listed}}")
        raise OpError(hint.cli(), found, hint=hint)
    return report


def check_model_source(path: str, family: str, where: str = "model.path",
                       workspace: str | Path | None = None) -> list[Problem]:
    """model.path's problems: a missing folder, a family mismatch, an uncached hub id
    (core/models/loading.py). Reads only."""
    from core.models.loading import check_model_source as check_source

    return check_source(path, family, where, workspace=workspace)


def estimate_memory(cfg: Config, workspace: Path,
                    buckets: list[tuple[int, int]] | None = None, *,
                    caches_built: bool) -> MemoryEstimate | None:
    """The memory a run of `cfg` (resolved) needs, or None when the model cannot be read
    without a download (core/memory/estimate.py); `caches_built`: every cache of `cfg`
    is built (`caches_complete`), so there is no caching phase. Reads only."""
    from core.memory.estimate import estimate_memory as estimate

    return estimate(cfg, workspace, buckets, caches_built=caches_built)


def estimate_inputs(cfg: Config) -> str:
    """What of `cfg` the memory estimate reads, to compare: an edit that leaves it the
    same (a caption setting, a path) needs no new estimate."""
    from core.data.controls import control_folders

    return repr((cfg.model, cfg.train, cfg.launch, cfg.validation,
                 [(d.resolution, d.frames, len(control_folders(d))) for d in cfg.datasets]))

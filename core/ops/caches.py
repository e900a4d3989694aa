"""Caches: start a cache build, read what is built, find and clear a dataset's cache."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.check import CheckReport
from core.config import Config, DatasetConfig
from core.exits import EXIT_FAILED
from core.ops.checks import require_ok
from core.ops.errors import OpError
from core.problems import Problem

if TYPE_CHECKING:
    from core.cache.clear import CacheFiles
    from core.cache.job import CacheJob
    from core.cache.status import CacheStatus


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


def cache_status(cfg: Config, workspace: str | Path) -> CacheStatus:
    """What is cached of `cfg` (resolved), per dataset and kind. Reads only."""
    from core.cache.status import cache_status as status

    return status(cfg, workspace)


def caches_complete(cfg: Config, workspace: str | Path) -> bool:
    """Whether every cache `cfg` (resolved) trains from is built and fresh."""
    from core.cache.status import caches_complete as complete

    return complete(cfg, workspace)


def cache_files(ds: DatasetConfig, cfg: Config) -> CacheFiles:
    """The cache files of dataset `ds` of `cfg` (resolved): what clearing it would delete,
    for the confirmation. A dataset without a vae_cache folder, or one whose folder overlaps
    a dataset's images, is refused (OpError)."""
    from core.cache.clear import ClearRefused, find_cache_files

    try:
        return find_cache_files(ds, cfg)
    except ClearRefused as exc:
        raise OpError(str(exc)) from None


def clear_cache(ds: DatasetConfig, cfg: Config) -> CacheFiles:
    """Delete the cache files of dataset `ds` of `cfg` (resolved), refused as
    `cache_files`; what was deleted."""
    from core.cache.clear import ClearRefused, clear_dataset_cache

    try:
        return clear_dataset_cache(ds, cfg)
    except ClearRefused as exc:
        raise OpError(str(exc)) from None

"""What the caches hold right now, per dataset: cached, stale or missing entries.

Read-only and cheap (image headers and safetensors headers, no torch): the UI's cache tab
calls it on demand. It uses the same plan as the cache builder (`plan_caches`) and the
same freshness rule (`is_fresh`), so "cached" here means exactly "the builder would skip
it". The model's identity (family + fingerprint) is computed the way the loaders do;
when it cannot be known yet (a tiny model not built, a path that does not exist), an
existing entry cannot be proven fresh and counts as stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from core.cache.plan import plan_caches
from core.cache.store import is_fresh, read_metadata
from core.config import Config
from core.problems import Problem


@dataclass
class EntryCounts:
    cached: int = 0
    stale: int = 0
    missing: int = 0

    @property
    def total(self) -> int:
        return self.cached + self.stale + self.missing

    def add(self, verdict: str) -> None:
        setattr(self, verdict, getattr(self, verdict) + 1)


@dataclass
class DatasetCacheStatus:
    id: str
    images: int
    vae_dir: str
    vae: EntryCounts = field(default_factory=EntryCounts)
    text: EntryCounts = field(default_factory=EntryCounts)


@dataclass
class CacheStatus:
    datasets: list[DatasetCacheStatus]
    text_dir: str
    model_known: bool
    note: str = ""
    problems: list[Problem] = field(default_factory=list)


def model_identity(cfg: Config, workspace: Path) -> tuple[dict[str, str] | None, str]:
    """(identity the cache entries record, note). None when it cannot be computed yet."""
    from core.models.loading import ModelLoadError, classify_source, fingerprint
    from core.models.source import model_source

    path, source = cfg.model.path, model_source(cfg.model.path)
    if source.kind == "tiny":
        from core.models.tiny import tiny_dir, tiny_is_built

        folder = tiny_dir(source.name, workspace)
        if not tiny_is_built(source.name, workspace):
            return None, (f"the tiny model is not built yet ({folder}); it is built by the "
                          "first cache build or training run")
        path = str(folder)
    if source.kind == "random":
        from core.models.full_size.build import random_fingerprint

        return {"family": cfg.model.family, "model": random_fingerprint(source.name)}, ""
    try:
        kind = classify_source(path)
        return {"family": cfg.model.family, "model": fingerprint(path, kind)}, ""
    except (ModelLoadError, OSError) as exc:
        return None, f"model.path cannot be read ({exc}); entries cannot be checked against it"


def verdict(entry: Path, expected: dict[str, str], model_known: bool) -> str:
    """'cached', 'stale' or 'missing' for one entry file."""
    if not entry.exists():
        return "missing"
    if not model_known:  # without the model's identity nothing can be proven fresh
        return "stale" if read_metadata(entry) is not None else "missing"
    return "cached" if is_fresh(entry, expected) else "stale"


def cache_status(cfg: Config, workspace: str | Path) -> CacheStatus:
    """Counts for a resolved config (absolute paths, see `core.config.resolved`)."""
    workspace = Path(workspace).expanduser().absolute()
    model, note = model_identity(cfg, workspace)
    known = model is not None
    # The plan needs some identity for the metadata; with none, only file presence counts.
    plan = plan_caches(cfg, model or {"family": cfg.model.family, "model": "?"})
    text_meta = {job.entry: job.meta for job in plan.text_jobs}
    out = []
    for ds_cfg, ds_plan in zip(cfg.datasets, plan.datasets, strict=True):
        status = DatasetCacheStatus(ds_cfg.id, len(ds_plan.items), ds_cfg.vae_cache)
        for job in ds_plan.vae_jobs:
            status.vae.add(verdict(job.entry, job.meta, known))
        for entry in sorted(set(ds_plan.text_entries)):
            status.text.add(verdict(entry, text_meta[entry], known))
        out.append(status)
    return CacheStatus(out, cfg.text_cache.dir, known, note, plan.problems)


def caches_complete(cfg: Config, workspace: str | Path) -> bool:
    """Whether every latent and text embedding of `cfg` (paths resolved) is cached and
    fresh, so a launch builds nothing first."""
    try:
        status = cache_status(cfg, workspace)
    except Exception:  # noqa: BLE001 - unknown counts as "not built"
        return False
    counts = [c for d in status.datasets for c in (d.vae, d.text)]
    return status.model_known and bool(counts) and all(
        c.total and not (c.stale or c.missing) for c in counts)

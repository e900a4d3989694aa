"""The cache stage: plan, find what is stale, split it between processes, build it.

Used by `python -m core.cache.main` (the `--stage cache` program that `accelerate launch`
runs) and by the trainer, which builds missing entries before its first step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.cache.build import (
    BuildStats,
    Progress,
    build_mask_entries,
    build_text_entries,
    build_vae_entries,
    encode_kwargs,
    my_share,
    stale,
)
from core.cache.plan import CachePlan, plan_caches
from core.cache.store import remove_stale_temp_files
from core.config import Config
from core.problems import Problem, samples_said
from core.startup import ProcessGroup

if TYPE_CHECKING:
    from core.models.base import Components, ModelFamily


@dataclass
class CacheReport:
    plan: CachePlan
    vae: BuildStats
    text: BuildStats
    stale_vae: int
    stale_text: int
    problems: list[Problem] = field(default_factory=list)
    masks: BuildStats = field(default_factory=BuildStats)  # datasets.N.masks
    stale_masks: int = 0

    def lines(self) -> list[str]:
        clips = sum(1 for job in self.plan.vae_jobs if job.frames)
        images = len(self.plan.vae_jobs) - clips
        samples = samples_said(images, clips, "clip(s)")
        captions = len(self.plan.text_jobs)
        masks = len(self.plan.mask_jobs)
        extra = [f"mask cache: {masks} mask(s), {self.stale_masks} to build, this process "
                 f"wrote {self.masks.written}"] if masks else []
        return extra + [
            f"vae cache: {samples}, {self.stale_vae} to build, this process wrote "
            f"{self.vae.written} in {self.vae.seconds:.1f}s",
            f"text cache: {captions} unique caption(s), {self.stale_text} to build, this "
            f"process wrote {self.text.written} in {self.text.seconds:.1f}s",
        ]


def model_identity(components: Components) -> dict[str, str]:
    return {"family": components.family, "model": components.fingerprint}


def build_caches(cfg: Config, family: ModelFamily, components: Components,
                 group: ProcessGroup | None = None, progress: Progress | None = None,
                 vae_batch: int = 4) -> CacheReport:
    """Bring every cache entry of a resolved config up to date.

    All processes compute the same plan and the same stale list before any of them writes
    (the first barrier), then each builds its share; the second barrier makes sure every
    entry exists before anyone trains on it.
    """
    import torch

    from core.models.modules import memory_trace

    group = group or ProcessGroup()
    plan = plan_caches(cfg, model_identity(components))
    if group.is_main:
        for folder in {Path(ds.vae_cache) for ds in cfg.datasets} | {Path(cfg.text_cache.dir)}:
            remove_stale_temp_files(folder)
    vae_todo, text_todo = stale(plan.vae_jobs), stale(plan.text_jobs)
    mask_todo = stale(plan.mask_jobs)
    group.barrier()
    vae_encoders, text_encoders = encode_kwargs(family, components)
    vae_stats = build_vae_entries(
        jobs=my_share(vae_todo, group.index, group.count), batch_size=vae_batch,
        device=group.device, dtype=getattr(components.vae, "dtype", torch.float32),
        progress=progress, **vae_encoders)
    memory_trace("latents encoded")
    text_stats = build_text_entries(jobs=my_share(text_todo, group.index, group.count),
                                    progress=progress, **text_encoders)
    memory_trace("captions encoded")
    group.barrier()
    mask_stats = BuildStats()
    if mask_todo:  # every process has the same list: all or none meet this barrier
        # Masks take their size from the latents, so they follow the barrier above.
        mask_stats = build_mask_entries(my_share(mask_todo, group.index, group.count),
                                        progress=progress)
        vae_stats.problems.extend(mask_stats.problems)
        group.barrier()
    problems = plan.problems + vae_stats.problems + text_stats.problems
    return CacheReport(plan, vae_stats, text_stats, len(vae_todo), len(text_todo), problems,
                       mask_stats, len(mask_todo))

"""Training items read from the caches, one dataset at a time, bucket by bucket.

Only images whose latents and caption embeddings are in the cache take part (a bad image
skipped at build time is simply absent). An entry that fails to load at train time is
deleted by the store, rebuilt through `rebuild` when the trainer provides it, and never
trained on half-read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.cache.plan import FLIPPED, CachePlan, DatasetPlan, MaskJob, TextJob, VaeJob
from core.cache.store import CacheReadError, is_fresh, load_entry
from core.config import Config
from core.data.sampler import SourceDataset

Rebuild = Callable[[VaeJob | TextJob | MaskJob], None]


@dataclass
class CachedItem:
    vae: VaeJob
    text: TextJob | None  # None: the caption is encoded at train time
    caption: str = ""
    mask: MaskJob | None = None  # None: trains unmasked


class CachedDataset:
    def __init__(self, dataset_id: str, items: list[CachedItem], repeats: int = 1,
                 probability: float = 1.0, rebuild: Rebuild | None = None,
                 regularization: bool = False) -> None:
        self.id = dataset_id
        self.regularization = regularization
        self.items = items
        self.repeats = repeats
        self.probability = probability
        self.rebuild = rebuild

    def __len__(self) -> int:
        return len(self.items)

    def source(self) -> SourceDataset:
        return SourceDataset(self.id, [item.vae.batch_key for item in self.items],
                             self.repeats, self.probability, self.regularization)

    def _load(self, job: VaeJob | TextJob | MaskJob) -> dict[str, Any]:
        try:
            return load_entry(job.entry)[0]
        except CacheReadError as exc:
            if self.rebuild is None:
                raise
            print(f"warning: {exc}; rebuilding it now", flush=True)
            self.rebuild(job)
            if not job.entry.exists():  # the rebuild skipped it: the source went bad
                source = getattr(job, "image", None) or repr(getattr(job, "caption", ""))
                raise CacheReadError(f"cache entry for {source} could not be rebuilt (the "
                                     "source no longer loads); fix or remove it, then resume"
                                     ) from exc
            return load_entry(job.entry)[0]

    def flips(self, index: int, seed: int, micro_step: int, slot: int) -> bool:
        """Whether item `index`, in global batch slot `slot` of `micro_step`, trains on
        its mirror image (a datasets.N.flip dataset's, half the time: tags.flip_draw)."""
        from core.data.tags import flip_draw

        return self.items[index].vae.flip and flip_draw(seed, micro_step, slot)

    def load(self, index: int, flipped: bool = False) -> dict[str, Any]:
        """One item in the shape collate expects; `flipped`: its mirror image's tensors
        (the entry's "flipped_" ones) and mirrored loss mask."""
        item = self.items[index]
        # Tensors a family caches beside the latents (see build._batched_tensors) pass
        # through; collate hands unknown keys on as per-item lists.
        tensors = self._load(item.vae)
        mirrored = {k[len(FLIPPED):]: v for k, v in tensors.items() if k.startswith(FLIPPED)}
        extra = mirrored if flipped else {k: v for k, v in tensors.items()
                                          if not k.startswith(FLIPPED)}
        latents = extra.pop("latents")
        width, height = item.vae.bucket
        mask = {} if item.mask is None else {"loss_mask": self._load(item.mask)["mask"]}
        if flipped and mask:
            mask["loss_mask"] = mask["loss_mask"].flip(-1)
        return {
            **extra,
            **mask,
            **(self._load(item.text) if item.text is not None else {}),
            "latents": latents,
            "original_size": item.vae.original_size,
            "crop_top_left": item.vae.crop_top_left,
            "target_size": (height, width),
            "path": str(item.vae.image),
            "caption": item.caption,
        }

    def load_text(self, job: TextJob) -> dict[str, Any]:
        """One cached text entry (the empty caption's, for caption dropout)."""
        return self._load(job)


def _cached_items(ds_plan: DatasetPlan, text_jobs: dict[Path, TextJob]) -> list[CachedItem]:
    items = []
    masks = ds_plan.mask_jobs or [None] * len(ds_plan.items)
    entries = ds_plan.text_entries or [None] * len(ds_plan.items)
    for image, job, mask, entry in zip(ds_plan.items, ds_plan.vae_jobs, masks, entries,
                                       strict=True):
        text = None if ds_plan.text_at_train_time else text_jobs[entry]
        if is_fresh(job.entry, job.meta) and (text is None or is_fresh(text.entry, text.meta)):
            # A mask that could not be built (a bad mask file, reported) is left out:
            # the image then trains unmasked.
            if mask is not None and not is_fresh(mask.entry, mask.meta):
                mask = None
            items.append(CachedItem(job, text, image.caption, mask))
    return items


def cached_datasets(cfg: Config, plan: CachePlan,
                    rebuild: Rebuild | None = None) -> list[CachedDataset]:
    """One CachedDataset per configured dataset, in config order (the sampler's indices)."""
    text_jobs = {job.entry: job for job in plan.text_jobs}
    out = []
    for ds_cfg, ds_plan in zip(cfg.datasets, plan.datasets, strict=True):
        out.append(CachedDataset(ds_cfg.id, _cached_items(ds_plan, text_jobs), ds_cfg.repeats,
                                 ds_cfg.probability, rebuild, ds_cfg.regularization))
    return out

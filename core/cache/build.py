"""Encode what the plan says is missing or stale, split between processes.

Each process takes every n-th stale entry of the same sorted list, so no entry is written
twice; text entries are deduplicated by caption before the split, so two datasets sharing a
caption share one file. Entries are written under a lock and re-checked inside it, which
also keeps two separate runs sharing a cache folder from writing the same file at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, TypeVar

from core.cache.plan import TextJob, VaeJob
from core.cache.store import atomic_save, entry_lock, is_fresh
from core.data.images import BadImage, load_rgb
from core.problems import Problem, warning

T = TypeVar("T")
Progress = Callable[[str, int, int], None]  # (kind, done, total)


@dataclass
class BuildStats:
    written: int = 0
    fresh: int = 0
    problems: list[Problem] = field(default_factory=list)
    seconds: float = 0.0


def stale(jobs: Sequence[T]) -> list[T]:
    """Jobs whose entry is missing, unreadable or made from something else."""
    return [job for job in jobs if not is_fresh(job.entry, job.meta)]


def my_share(jobs: Sequence[T], process_index: int, num_processes: int) -> list[T]:
    return list(jobs[process_index::num_processes])


def load_pixels(job: VaeJob) -> Any:
    """The image resized and cropped to its bucket, as a [3, H, W] tensor in [-1, 1]."""
    import numpy as np
    import torch
    from PIL import Image

    image = load_rgb(job.image)
    scaled_w, scaled_h, left, top = job.box
    if image.size != (scaled_w, scaled_h):
        image = image.resize((scaled_w, scaled_h), Image.Resampling.BICUBIC)
    width, height = job.bucket
    image = image.crop((left, top, left + width, top + height))
    array = np.asarray(image, dtype=np.float32) / 127.5 - 1.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def _chunks(jobs: list[VaeJob], batch_size: int) -> Iterator[list[VaeJob]]:
    """Same-bucket chunks (a VAE batch needs one shape), in plan order within a bucket."""
    ordered = sorted(jobs, key=lambda j: j.bucket)
    for _, group in groupby(ordered, key=lambda j: j.bucket):
        items = list(group)
        for start in range(0, len(items), batch_size):
            yield items[start:start + batch_size]


def _load_chunk(chunk: list[VaeJob]) -> tuple[list[VaeJob], list[Any], list[Problem]]:
    jobs, pixels, problems = [], [], []
    for job in chunk:
        try:
            pixels.append(load_pixels(job))
            jobs.append(job)
        except BadImage as exc:
            problems.append(warning(str(job.image), f"{exc.reason}; skipped, not cached"))
    return jobs, pixels, problems


def _save_if_stale(job: VaeJob | TextJob, tensors: dict[str, Any], stats: BuildStats) -> None:
    with entry_lock(job.entry):
        if is_fresh(job.entry, job.meta):  # another writer got there first
            stats.fresh += 1
            return
        atomic_save(tensors, job.meta, job.entry)
        stats.written += 1


def build_vae_entries(encode: Callable[[Any], Any], jobs: list[VaeJob], *, batch_size: int = 4,
                      device: Any = "cpu", dtype: Any = None,
                      progress: Progress | None = None) -> BuildStats:
    """Encode `jobs` (this process's share) with `encode(pixels) -> latents`.

    Decoding the next chunk overlaps with encoding this one (a thread: PIL releases the
    GIL), which keeps the build close to raw VAE speed.
    """
    import torch

    stats, start, done = BuildStats(), time.perf_counter(), 0
    chunks = list(_chunks(jobs, batch_size))
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_load_chunk, chunks[0]) if chunks else None
        for i in range(len(chunks)):
            loaded, pixels, problems = pending.result()
            pending = pool.submit(_load_chunk, chunks[i + 1]) if i + 1 < len(chunks) else None
            stats.problems.extend(problems)
            if pixels:
                batch = torch.stack(pixels).to(device=device, dtype=dtype)
                with torch.no_grad():
                    latents = encode(batch).float().cpu()
                for job, latent in zip(loaded, latents, strict=True):
                    _save_if_stale(job, {"latents": latent}, stats)
            done += len(chunks[i])
            if progress:
                progress("vae", done, len(jobs))
    stats.seconds = time.perf_counter() - start
    return stats


def build_text_entries(encode: Callable[[list[str]], list[dict[str, Any]]], jobs: list[TextJob],
                       *, batch_size: int = 16, progress: Progress | None = None) -> BuildStats:
    """Encode this process's share of unique captions, one entry file per caption."""
    import torch

    stats, start = BuildStats(), time.perf_counter()
    for begin in range(0, len(jobs), batch_size):
        chunk = jobs[begin:begin + batch_size]
        with torch.no_grad():
            encoded = encode([job.caption for job in chunk])
        for job, tensors in zip(chunk, encoded, strict=True):
            _save_if_stale(job, {k: v.cpu() for k, v in tensors.items()}, stats)
        if progress:
            progress("text", begin + len(chunk), len(jobs))
    stats.seconds = time.perf_counter() - start
    return stats

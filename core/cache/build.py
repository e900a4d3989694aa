"""Encode what the plan says is missing or stale, split between processes.

Each process takes every n-th stale entry of the same sorted list, so no entry is written
twice; text entries are deduplicated by caption before the split, so two datasets sharing a
caption share one file. Entries are written under a lock and re-checked inside it, which
also keeps two separate runs sharing a cache folder from writing the same file at once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, TypeVar

from core.cache.plan import FLIPPED, MaskJob, TextJob, VaeJob
from core.cache.store import atomic_save, entry_lock, is_fresh
from core.data.images import BadImage, load_rgb
from core.models.modules import vae_batch_size
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
    """The image resized and cropped to its bucket, as a [3, H, W] tensor in [-1, 1]; a
    clip's frames each so, as [3, F, H, W].

    This runs on the loader thread, so the arithmetic and the HWC -> CHW copy stay in
    numpy: a torch op there (`.contiguous()` on an image-sized tensor is parallelised)
    starts a second OpenMP team beside the encoder's, oversubscribing the cores. On 2
    cores that made every VAE encode of the build about 1.5x slower (bench/cache.py).
    """
    import numpy as np
    import torch

    if job.frames:
        from core.data.video import read_frames

        frames = [_fitted(job, frame) for frame in read_frames(job.image, list(job.frames))]
        array = np.stack(frames).transpose(3, 0, 1, 2)  # [3, F, H, W]
    else:
        array = _fitted(job, load_rgb(job.image)).transpose(2, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(array))


def _fitted(job: VaeJob, image: Any) -> Any:
    """One RGB image resized and cropped to the job's bucket, HWC float32 in [-1, 1]."""
    import numpy as np
    from PIL import Image

    scaled_w, scaled_h, left, top = job.box
    if image.size != (scaled_w, scaled_h):
        image = image.resize((scaled_w, scaled_h), Image.Resampling.BICUBIC)
    width, height = job.bucket
    image = image.crop((left, top, left + width, top + height))
    return np.asarray(image, dtype=np.float32) / 127.5 - 1.0


def load_controls(job: VaeJob) -> list[Any]:
    """An edit pair's control images, each fitted to the target's bucket, as [3, H, W]
    tensors in [-1, 1] (core/data/controls.py)."""
    import numpy as np
    import torch

    from core.data.controls import fit_control

    return [torch.from_numpy(np.ascontiguousarray(fit_control(load_rgb(path), job.bucket)
                                                  .transpose(2, 0, 1)))
            for path in job.controls]


def _chunk_key(job: VaeJob) -> tuple[int, ...]:
    return (*job.batch_key, len(job.controls), job.flip)


def _chunks(jobs: list[VaeJob], batch_size: int) -> Iterator[list[VaeJob]]:
    """Same-shape chunks (a VAE batch needs one: bucket, frame count and number of
    control images), in plan order within a bucket; at most `batch_size` items, fewer
    for large shapes (vae_batch_size: the encode's memory grows with the pixels)."""
    ordered = sorted(jobs, key=_chunk_key)
    for _, group in groupby(ordered, key=_chunk_key):
        items = list(group)
        width, height = items[0].bucket
        size = vae_batch_size(width, height, len(items[0].frames) or 1, batch_size)
        for start in range(0, len(items), size):
            yield items[start:start + size]


@dataclass
class _Loaded:
    jobs: list[VaeJob] = field(default_factory=list)
    pixels: list[Any] = field(default_factory=list)
    controls: list[list[Any]] = field(default_factory=list)  # per job, per control
    audio: list[Any] = field(default_factory=list)  # per job: its waveform, or None
    problems: list[Problem] = field(default_factory=list)


def load_audio(job: VaeJob, rate: int, problems: list[Problem]) -> Any:
    """A clip's audio under its frames ([channels, samples] at `rate`), or None: no
    audio window, no audio stream, or one that does not decode (a warning naming the
    file: the clip trains video-only)."""
    if job.audio is None or not rate:
        return None
    from core.data.audio import BadAudio, read_audio

    try:
        return read_audio(job.image, *job.audio, rate)
    except BadAudio as exc:
        problems.append(warning(str(job.image), f"{exc.reason}; trains video-only"))
        return None


def _load_chunk(chunk: list[VaeJob], audio_rate: int = 0) -> _Loaded:
    out = _Loaded()
    for job in chunk:
        try:
            pixels = load_pixels(job)
        except BadImage as exc:  # a BadClip too
            out.problems.append(warning(str(job.image), f"{exc.reason}; skipped, not cached"))
            continue
        try:
            controls = load_controls(job)
        except BadImage as exc:
            out.problems.append(warning(str(exc.path), f"{exc.reason}; {job.image}, its "
                                                       "target, is skipped, not cached"))
            continue
        out.jobs.append(job)
        out.pixels.append(pixels)
        out.controls.append(controls)
        out.audio.append(load_audio(job, audio_rate, out.problems))
    return out


def _save_if_stale(job: VaeJob | TextJob | MaskJob, tensors: dict[str, Any]) -> bool:
    """Write the entry unless it is fresh by now; True when this call wrote it."""
    with entry_lock(job.entry):
        if is_fresh(job.entry, job.meta):  # another writer got there first
            return False
        atomic_save(tensors, job.meta, job.entry)
        return True


class _Writer:
    """Saves entries on background threads while the caller encodes the next batch.

    A save is mostly two fsyncs (the file, then its folder) at several milliseconds each,
    which on the caller's thread would stall the encoder about as long as a small model
    takes to encode. fsync releases the GIL, and the filesystem commits concurrent fsyncs
    together (ext4 here: 96 entries take about 0.47 s on one thread, 0.03 s on four), so
    a few threads make saving nearly free. Entry locks still keep two writers (threads or
    processes) off one file. At most `max_pending` saves wait, so a slow disk slows the
    build instead of letting encoded tensors pile up in memory. Counts go into `stats` on
    the caller's thread as results come back. A failed save (disk full) re-raises on the
    caller's thread at the next submit or on leaving the `with` block, and the saves not
    yet started are dropped; when the block is left by an exception, the running saves
    finish (finished entries are kept) and that exception is the one raised.
    """

    def __init__(self, stats: BuildStats, threads: int = 4, max_pending: int = 64) -> None:
        self.stats = stats
        self.max_pending = max_pending
        self.pending: deque[Future[bool]] = deque()
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="cache-writer")

    def _collect(self, future: Future[bool]) -> None:
        if future.result():
            self.stats.written += 1
        else:
            self.stats.fresh += 1

    def submit(self, job: VaeJob | TextJob | MaskJob, tensors: dict[str, Any]) -> None:
        while len(self.pending) >= self.max_pending:
            self._collect(self.pending.popleft())
        self.pending.append(self.pool.submit(_save_if_stale, job, tensors))

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            while self.pending:
                future = self.pending.popleft()
                if exc_type is None:
                    self._collect(future)
                else:
                    future.exception()  # wait; the error already in flight wins
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _batched_tensors(encoded: Any) -> dict[str, Any]:
    """An encode's output as the entry's tensors, batched, float32 on the CPU: latents
    alone, or a dict holding "latents" and any further per-item tensors a family keeps
    beside them (an image-to-video condition), which the dataset passes through."""
    tensors = encoded if isinstance(encoded, dict) else {"latents": encoded}
    return {k: v.float().cpu() for k, v in tensors.items()}


def build_vae_entries(encode: Callable[[Any], Any], jobs: list[VaeJob], *, batch_size: int = 4,
                      device: Any = "cpu", dtype: Any = None,
                      progress: Progress | None = None,
                      encode_controls: Callable[[list[Any]], dict[str, Any]] | None = None,
                      encode_audio: Callable[[Any, int, float], Any] | None = None,
                      audio_rate: int = 0) -> BuildStats:
    """Encode `jobs` (this process's share) with `encode(pixels) -> latents` (or a
    dict of batched tensors holding "latents", see `_batched_tensors`); an edit pair's
    control images too, with `encode_controls(controls) -> tensors` (the family's
    edit.encode_controls: one [B, 3, H, W] batch per control image), saved in the same entry;
    a clip's audio track (a family with audio: read at `audio_rate`, encoded by
    `encode_audio(waveform, frames, fps)`) as "audio_latents" there too.

    Decoding the next chunk (a thread: PIL releases the GIL) and saving the last ones
    (`_Writer`) overlap with encoding this one, which keeps the build close to raw VAE speed.
    """

    stats, start, done = BuildStats(), time.perf_counter(), 0
    chunks = list(_chunks(jobs, batch_size))
    with _Writer(stats) as writer, ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="cache-loader") as pool:
        rate = audio_rate if encode_audio is not None else 0
        pending = pool.submit(_load_chunk, chunks[0], rate) if chunks else None
        for i in range(len(chunks)):
            loaded = pending.result()
            pending = pool.submit(_load_chunk, chunks[i + 1], rate) \
                if i + 1 < len(chunks) else None
            stats.problems.extend(loaded.problems)
            if loaded.pixels:
                encoded = _encode_chunk(encode, encode_controls, loaded, device, dtype)
                for row, job in enumerate(loaded.jobs):
                    tensors = {k: v[row] for k, v in encoded.items()}
                    tensors.update(_audio_tensors(encode_audio, job, loaded.audio[row]))
                    writer.submit(job, tensors)
            done += len(chunks[i])
            if progress:
                progress("vae", done, len(jobs))
    stats.seconds = time.perf_counter() - start
    return stats


def _encode_chunk(encode: Callable[[Any], Any],
                  encode_controls: Callable[[list[Any]], dict[str, Any]] | None,
                  loaded: _Loaded, device: Any, dtype: Any) -> dict[str, Any]:
    import torch

    with torch.no_grad():
        pixels = torch.stack(loaded.pixels).to(device=device, dtype=dtype)
        encoded = _batched_tensors(encode(pixels))
        if loaded.jobs[0].flip:  # a chunk flips whole (_chunk_key): the mirror images too
            mirrored = _batched_tensors(encode(torch.flip(pixels, dims=[-1])))
            encoded.update({FLIPPED + k: v for k, v in mirrored.items()})
        count = len(loaded.controls[0])
        if count:
            if encode_controls is None:
                raise ValueError("control images given but the model encodes none")
            batches = [torch.stack([c[k] for c in loaded.controls]).to(device=device,
                                                                       dtype=dtype)
                       for k in range(count)]
            encoded.update(_batched_tensors(encode_controls(batches)))
    return encoded


def _audio_tensors(encode_audio: Callable[[Any, int, float], Any] | None, job: VaeJob,
                   waveform: Any) -> dict[str, Any]:
    """The entry's "audio_latents" (and its flip's, the same: a mirror image sounds the
    same) for a clip with audio; {} otherwise."""
    if encode_audio is None or waveform is None or job.audio is None:
        return {}
    import torch

    frames = len(job.frames)
    latents = encode_audio(torch.from_numpy(waveform)[None], frames, frames / job.audio[1])
    out = {"audio_latents": latents[0].float().cpu()}
    return out | ({FLIPPED + "audio_latents": out["audio_latents"]} if job.flip else {})


def encode_kwargs(family: Any, components: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (VAE, text) encoders of a loaded model as the keyword arguments of
    build_vae_entries and build_text_entries."""
    from core.models.capabilities import control_latents

    vae: dict[str, Any] = {"encode": lambda pixels: family.encode_images(components, pixels)}
    text: dict[str, Any] = {"encode": lambda captions: family.encode_prompts(components, captions)}
    edit, audio = family.edit, family.audio
    if edit:  # an edit pair's control images, encoded into the target's entry
        vae["encode_controls"] = lambda controls: control_latents(family, components, controls)
        if edit.text_reads_references:  # captions cached with their control images
            text["encode_with_images"] = lambda captions, images: (
                edit.encode_prompts_with_images(components, captions, images))
    if audio:  # a clip's audio track, encoded into its entry
        vae.update(encode_audio=lambda wave, frames, fps: audio.encode(
            components, wave, frames, fps), audio_rate=audio.sample_rate(components))
    return vae, text


def build_text_entries(encode: Callable[[list[str]], list[dict[str, Any]]], jobs: list[TextJob],
                       *, batch_size: int = 16, progress: Progress | None = None,
                       encode_with_images: Callable[[list[str], list[list[Any]]],
                                                    list[dict[str, Any]]] | None = None
                       ) -> BuildStats:
    """Encode this process's share of unique captions, one entry file per caption (per
    caption and control images, for a text encoder that reads them: `encode_with_images`,
    the family's edit.encode_prompts_with_images)."""
    import torch

    stats, start = BuildStats(), time.perf_counter()
    with _Writer(stats) as writer:
        for begin in range(0, len(jobs), batch_size):
            chunk = jobs[begin:begin + batch_size]
            with torch.no_grad():
                encoded = _encode_texts(encode, encode_with_images, chunk, stats)
            for job, tensors in zip(chunk, encoded, strict=True):
                if tensors is not None:
                    writer.submit(job, {k: v.cpu() for k, v in tensors.items()})
            if progress:
                progress("text", begin + len(chunk), len(jobs))
    stats.seconds = time.perf_counter() - start
    return stats


def _encode_texts(encode: Callable[[list[str]], list[dict[str, Any]]],
                  encode_with_images: Callable[[list[str], list[list[Any]]],
                                               list[dict[str, Any]]] | None,
                  chunk: list[TextJob], stats: BuildStats) -> list[dict[str, Any] | None]:
    """One chunk's encodings in order; None for a job whose control image does not load
    (a warning in `stats`: its target is skipped at train time, its entry being absent)."""
    if not any(job.images for job in chunk):
        return list(encode([job.caption for job in chunk]))
    if encode_with_images is None:
        raise ValueError("captions with control images given but the model reads none")
    usable, images = [], []
    for job in chunk:
        try:
            images.append([load_rgb(path) for path in job.images])
            usable.append(job)
        except BadImage as exc:
            stats.problems.append(warning(str(exc.path), f"{exc.reason}; the caption read "
                                                         "with it is not cached"))
    done = iter(encode_with_images([job.caption for job in usable], images) if usable else [])
    return [next(done) if job in usable else None for job in chunk]


def latent_size(entry: Any) -> tuple[int, int] | None:
    """(h, w) of the latents an entry holds, from its header; None when it is absent or
    does not load (its image was skipped)."""
    from safetensors import safe_open

    try:
        with safe_open(str(entry), framework="pt") as handle:
            shape = handle.get_slice("latents").get_shape()
    except Exception:  # missing or broken: the VAE build reports those itself
        return None
    return int(shape[-2]), int(shape[-1])


def build_mask_entries(jobs: list[MaskJob], progress: Progress | None = None) -> BuildStats:
    """Each job's mask at the size of its image's cached latents (core/data/masks.py),
    written atomically like every entry. Runs after the latents exist; an image whose
    latents are absent (skipped as bad) gets no mask entry either."""
    from core.data.masks import load_mask

    stats, start = BuildStats(), time.perf_counter()
    with _Writer(stats) as writer:
        for done, job in enumerate(jobs, start=1):
            size = latent_size(job.latent_entry)
            if size is not None:
                try:
                    mask = load_mask(job.mask, job.image_size, job.box, job.bucket, size)
                    writer.submit(job, {"mask": mask})
                except BadImage as exc:
                    stats.problems.append(warning(str(job.mask), f"{exc.reason}; the mask "
                                                  f"is not used, {job.image} trains unmasked"))
            if progress:
                progress("mask", done, len(jobs))
    stats.seconds = time.perf_counter() - start
    return stats

"""What the caches should hold: one VAE entry per image, one text entry per unique caption.

Some captions are never cached: a dataset with `shuffle_tags` trains on a new order of its
tags every sample, and `train.text_encoder_lora` trains the encoders the cache would have
used; both encode at train time (`text_at_train_time`). With `train.caption_dropout` the
empty caption is cached once, for the samples that drop theirs (and for
`train.guidance_target_scale`'s unconditional prediction).

Pure planning (no torch): index the datasets, decide each image's bucket and crop, and name
the entry file with the fields it must record. Every process computes the same plan, so
the work can be split between them without talking.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

from core.config import Config, DatasetConfig
from core.data.buckets import bucket_for, crop_box
from core.data.index import ImageItem, index_dataset
from core.problems import Problem

ENTRY_SUFFIX = ".safetensors"
MASK_SUFFIX = ".mask" + ENTRY_SUFFIX
FLIPPED = "flipped_"  # a datasets.N.flip entry's mirror-image tensors: flipped_latents, ...


@dataclass(frozen=True)
class VaeJob:
    dataset_id: str
    image: Path
    entry: Path
    bucket: tuple[int, int]  # (width, height)
    box: tuple[int, int, int, int]  # scaled width, scaled height, left, top
    original_size: tuple[int, int]  # (height, width), as SDXL conditions on it
    crop_top_left: tuple[int, int]  # (top, left)
    meta: dict[str, str] = field(hash=False, compare=False)
    frames: tuple[int, ...] = ()  # a clip's source frame indices; () for an image
    controls: tuple[Path, ...] = ()  # an edit model's control images, encoded beside
    flip: bool = False  # datasets.N.flip: the mirror image is encoded too
    # A clip of a family that trains audio (datasets.N.audio not off): the seconds its
    # frames span in the file, (start, duration), whose audio is encoded beside them.
    audio: tuple[float, float] | None = None

    @property
    def batch_key(self) -> tuple[int, ...]:
        """What the items of one batch share: the bucket (width, height), and for a
        clip its frame count, (width, height, frames)."""
        return self.bucket + ((len(self.frames),) if self.frames else ())


@dataclass(frozen=True)
class TextJob:
    caption: str
    entry: Path
    meta: dict[str, str] = field(hash=False, compare=False)
    # The control images the text encoder reads with the caption (an edit family with
    # edit.text_reads_references); () for a caption alone.
    images: tuple[Path, ...] = ()


@dataclass(frozen=True)
class MaskJob:
    """One image's loss mask at latent resolution (datasets.N.masks), beside its latents.
    Fresh while the mask file, the image's bucket and crop, and the model (which sets the
    latent size) are unchanged."""

    dataset_id: str
    image: Path
    mask: Path
    entry: Path
    latent_entry: Path  # the image's VAE entry, whose latents set the mask's size
    image_size: tuple[int, int]  # (width, height)
    bucket: tuple[int, int]
    box: tuple[int, int, int, int]
    meta: dict[str, str] = field(hash=False, compare=False)


@dataclass
class DatasetPlan:
    dataset_id: str
    items: list[ImageItem]
    vae_jobs: list[VaeJob]  # parallel to items
    text_entries: list[Path]  # parallel to items; empty when text_at_train_time
    text_at_train_time: bool = False
    mask_jobs: list[MaskJob | None] = field(default_factory=list)  # parallel to items


@dataclass
class CachePlan:
    datasets: list[DatasetPlan]
    text_jobs: list[TextJob]  # unique captions, sorted: identical on every process
    problems: list[Problem]

    @property
    def vae_jobs(self) -> list[VaeJob]:
        return [job for ds in self.datasets for job in ds.vae_jobs]

    @property
    def mask_jobs(self) -> list[MaskJob]:
        return [job for ds in self.datasets for job in ds.mask_jobs if job is not None]


# How each dataset key reaches a VAE entry: the metadata key that records it (a change
# there makes the entry stale, so it is rebuilt), or why the latents do not depend on it.
# A new dataset key goes in one of the two; tests/test_seams.py fails otherwise.
IN_ENTRY_METADATA = {
    "images": "source",  # the source file's path, size and mtime
    "resolution": "resolution",
    "bucketing": "bucket", "bucket_min_side": "bucket", "bucket_max_side": "bucket",
    "flip": "flip",  # and the mirror image's latents beside the image's
    "crop": "box",
    "frames": "frames", "fps": "frames", "clips": "frames", "clip_count": "frames",
    "clip_stride": "frames",
    "audio": "audio",  # on: the window of the track encoded; off: no such key
    "control": "control0_source", "control_2": "control1_source",
    "control_3": "control2_source",
}
NOT_IN_LATENTS = {
    "id": "names the dataset",
    "vae_cache": "is where the entries are",
    "caption": "captions go to the text cache, keyed by their text",
    "instance_prompt": "captions go to the text cache, keyed by their text",
    "repeats": "sampling only", "probability": "sampling only",
    "shuffle_tags": "captions at train time", "keep_tokens": "captions at train time",
    "masks": "mask entries carry their own file's stamps (mask_source)",
    "regularization": "weighs the loss only",
    "preserve": "sets the loss's target only", "preserve_weight": "weighs the loss only",
}


def text_entry_path(text_dir: Path, caption: str, images: tuple[Path, ...] = ()) -> Path:
    """The entry of a caption, or of a caption read with control images (keyed by their
    paths too: the same caption with another control image is another embedding)."""
    key = "\0".join([caption, *map(str, images)])
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    return text_dir / digest[:2] / f"{digest[2:34]}{ENTRY_SUFFIX}"


def control_stamps(controls: tuple[Path, ...]) -> dict[str, str]:
    """Entry metadata naming each control image's file, size and mtime: an entry made
    from a control image that has since changed is stale."""
    return {f"control{n}_{k}": v for n, path in enumerate(controls)
            for k, v in source_stamp(path).items()}


def vae_entry_path(ds: DatasetConfig, image: Path, clip: int = 0) -> Path:
    """`<cache>/<relative path>.safetensors`; a video's further clips (clips = "uniform")
    `<relative path>.clipNNN.safetensors`."""
    relative = image.relative_to(ds.images)
    name = relative.name + (f".clip{clip:03d}" if clip else "")
    return Path(ds.vae_cache) / relative.parent / f"{name}{ENTRY_SUFFIX}"


def source_stamp(path: Path) -> dict[str, str]:
    stat = path.stat()
    return {"source": str(path), "source_size": str(stat.st_size),
            "source_mtime_ns": str(stat.st_mtime_ns)}


def audio_window(ds: DatasetConfig, item: ImageItem) -> tuple[float, float] | None:
    """The seconds a clip sample's frames span, (start, duration): from its first source
    frame, as many frames as it holds at the rate it is sampled at (datasets.N.fps, or
    the clip's own); None for an image or an unknown rate."""
    if not item.frames or item.fps <= 0:
        return None
    rate = ds.fps or item.fps
    return round(item.frames[0] / item.fps, 6), round(len(item.frames) / rate, 6)


def _vae_job(ds: DatasetConfig, item: ImageItem, seed: int, model: dict[str, str],
             audio: bool = False) -> VaeJob:
    bucket = bucket_for(item.width, item.height, ds.resolution, ds.bucketing, ds.crop,
                        ds.bucket_min_side, ds.bucket_max_side)
    # A random crop is drawn once per image (seeded by the image) and cached with it.
    rng = random.Random(f"{seed}:{item.path}") if ds.crop == "random" else None
    box = crop_box(item.width, item.height, bucket, ds.crop, rng)
    meta = {
        **source_stamp(item.path), **model,
        "resolution": str(ds.resolution), "bucket": f"{bucket.width}x{bucket.height}",
        "crop": ds.crop, "box": ",".join(map(str, box)),
    }
    if item.frames:  # a clip: which source frames (fps, frames and clips decide them)
        meta["frames"] = ",".join(map(str, item.frames))
    if ds.flip:  # the entry holds the mirror image's latents too ("flipped_" keys)
        meta["flip"] = "1"
    window = audio_window(ds, item) if audio and ds.audio != "off" else None
    if window is not None:  # the entry holds that stretch of the track's latents
        meta["audio"] = "{},{}".format(*window)
    meta.update(control_stamps(item.controls))
    return VaeJob(ds.id, item.path, vae_entry_path(ds, item.path, item.clip),
                  (bucket.width, bucket.height), tuple(box), (item.height, item.width),
                  (box.top, box.left), meta, item.frames, item.controls, ds.flip, window)


def _mask_job(item: ImageItem, vae: VaeJob, model: dict[str, str]) -> MaskJob | None:
    if item.mask is None:
        return None
    stamp = {f"mask_{k}": v for k, v in source_stamp(item.mask).items()}
    meta = {**stamp, **model, "kind": "mask", "image": str(item.path),
            "bucket": vae.meta["bucket"], "box": vae.meta["box"]}
    entry = vae.entry.with_name(vae.entry.name.removesuffix(ENTRY_SUFFIX)
                                + MASK_SUFFIX)
    return MaskJob(vae.dataset_id, item.path, item.mask, entry, vae.entry,
                   (item.width, item.height), vae.bucket, vae.box, meta)


def text_at_train_time(cfg: Config, ds: DatasetConfig) -> bool:
    """Whether this dataset's captions are encoded while training instead of cached."""
    return bool(cfg.train.text_encoder_lora or ds.shuffle_tags)


def cached_empty_caption(cfg: Config) -> bool:
    """Whether the empty caption is cached, for caption dropout or for the unconditional
    prediction of train.guidance_target_scale: when some dataset reads its text from the
    cache (a train-time dataset encodes "" itself)."""
    wanted = cfg.train.caption_dropout > 0 or cfg.train.guidance_target_scale > 0
    return wanted and not all(
        text_at_train_time(cfg, ds) for ds in cfg.datasets)


def plan_caches(cfg: Config, model: dict[str, str], verify: bool = False) -> CachePlan:
    """Plan for a resolved config. `model` holds the fields that identify the model
    (family and fingerprint); they go into every entry's metadata."""
    from core.models.registry import family_or_defaults

    text_dir = Path(cfg.text_cache.dir)
    family = family_or_defaults(cfg.model.family)
    reads_references = bool(family.edit and family.edit.text_reads_references)
    plans, problems, texts = [], [], set()
    for i, ds in enumerate(cfg.datasets):
        index = index_dataset(ds, f"datasets.{i}", verify=verify, video=family.video)
        problems.extend(index.problems)
        jobs = [_vae_job(ds, item, cfg.train.seed, model, family.audio is not None)
                for item in index.items]
        at_train_time = text_at_train_time(cfg, ds)
        keys = [(item.caption, item.controls if reads_references else ())
                for item in index.items]
        entries = [] if at_train_time else [text_entry_path(text_dir, *k) for k in keys]
        if not at_train_time:
            texts.update(keys)
        masks = [_mask_job(item, job, model) for item, job in zip(index.items, jobs,
                                                                  strict=True)]
        plans.append(DatasetPlan(ds.id, index.items, jobs, entries, at_train_time, masks))
    if cached_empty_caption(cfg):
        texts.add(("", ()))
    return CachePlan(plans, [_text_job(text_dir, c, images, model)
                             for c, images in sorted(texts)], problems)


def _text_job(text_dir: Path, caption: str, images: tuple[Path, ...],
              model: dict[str, str]) -> TextJob:
    meta = {"caption": caption, **model, **control_stamps(images)}
    return TextJob(caption, text_entry_path(text_dir, caption, images), meta, images)

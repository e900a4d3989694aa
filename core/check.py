"""`--stage check`: every problem with a config and its datasets, found without side effects.

Validates keys and ranges, the model path, directory conflicts, every image header and
every other file the config names (init_lora, masks, control and validation control
images, model.config), then summarises what training would see: images per dataset,
the bucket histogram and steps per epoch. Reads files; creates and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import Config, resolved, validate_config
from core.config.preserve import preserve_line
from core.config.training_adapter import training_adapter_problems
from core.data.conflicts import check_directory_conflicts
from core.memory.estimate import MemoryEstimate
from core.problems import (
    Problem,
    error,
    errors,
    errors_first,
    samples_said,
    warning,
    warnings,
)


@dataclass
class DatasetSummary:
    id: str
    images: int
    buckets: list[tuple[int, int]] = field(default_factory=list)  # one per image
    # per item, for a video family: its frame count (1 for an image); empty otherwise
    frames: list[int] = field(default_factory=list)
    regularization: bool = False  # class images (datasets.N.regularization)
    per_epoch: int = 0  # images x repeats drawn per epoch (0 when not computed)
    controls: int = 0  # an edit dataset's control images per target (0: not paired)
    # a family that trains audio: (clips with an audio track, clips without); None else
    audio: tuple[int, int] | None = None

    @property
    def keys(self) -> list[tuple[int, ...]]:
        """Each item's batch key: (width, height), or (width, height, frames) for a video
        family's items."""
        if not self.frames:
            return list(self.buckets)
        return [(*b, f) for b, f in zip(self.buckets, self.frames, strict=True)]

    @property
    def label(self) -> str:
        """The dataset's name in the summary and the histogram's legend."""
        return f"{self.id} (regularization)" if self.regularization else self.id

    @property
    def counted(self) -> str:
        """What the dataset holds, as the summaries say it: "5 image(s)"; a video
        family's "3 clip sample(s)" (with its images first, when it has some)."""
        if not self.frames:
            return f"{self.images} image(s)"
        clips = sum(1 for f in self.frames if f > 1)
        sound = "" if self.audio is None else \
            f"; {self.audio[0]} clip(s) with audio, {self.audio[1]} without"
        return samples_said(self.images - clips, clips, "clip sample(s)") + sound


def _audio_count(cfg: Any, ds: Any, items: list[Any]) -> tuple[int, int] | None:
    """(clips with an audio track, clips without) for a family that trains audio with
    the dataset's audio on; None otherwise. Each video counts once."""
    from core.data.audio import has_audio
    from core.models.registry import family_or_defaults

    if family_or_defaults(cfg.model.family).audio is None or ds.audio == "off":
        return None
    clips = {item.path for item in items if item.frames}
    sounding = sum(1 for path in clips if has_audio(path))
    return sounding, len(clips) - sounding


@dataclass
class CheckReport:
    problems: list[Problem]
    datasets: list[DatasetSummary]
    steps_per_epoch: int | None
    memory: MemoryEstimate | None = None
    notes: list[str] = field(default_factory=list)  # how training will treat the config

    @property
    def ok(self) -> bool:
        return not errors(self.problems)

    def lines(self) -> list[str]:
        """What the CLI prints: errors, then warnings, then the summary."""
        from core.data.buckets import bucket_histogram, format_histogram

        out = [str(p) for p in errors_first(self.problems)]
        n_err, n_warn = len(errors(self.problems)), len(warnings(self.problems))
        out.append(f"summary: {n_err} error(s), {n_warn} warning(s)")
        out += [f"note: {note}" for note in self.notes]
        for ds in self.datasets:
            kind = " (regularization images)" if ds.regularization else ""
            what = ds.counted
            if ds.controls:
                what += (f", each paired with {ds.controls} control image"
                         f"{'s' if ds.controls > 1 else ''}")
            out.append(f"dataset '{ds.id}': {what}{kind}")
            if ds.buckets:
                out += [f"  {line}" for line in format_histogram(bucket_histogram(ds.keys))]
        out += regularization_lines(self.datasets)
        if self.steps_per_epoch is not None:
            out.append(f"steps per epoch: {self.steps_per_epoch} (optimizer steps)")
        if self.memory is not None:
            out += self.memory.lines()
        return out


def _summarise(cfg: Config, problems: list[Problem]) -> tuple[list[DatasetSummary], int | None]:
    from core.data.buckets import check_resolution, check_settings, check_sides
    from core.data.index import index_dataset
    from core.data.sampler import MultiDatasetSampler, SourceDataset
    from core.models.registry import family_or_defaults

    missing = {p.where for p in problems if p.level == "error"}
    summaries, sources = [], []
    video = family_or_defaults(cfg.model.family).video
    for i, ds in enumerate(cfg.datasets):
        key = f"datasets.{i}"
        if f"{key}.images" in missing or not ds.images:
            continue
        settings = check_resolution(ds.resolution, f"{key}.resolution")
        settings += check_settings(ds.bucketing, ds.crop, key)
        settings += check_sides(ds.resolution, ds.bucket_min_side, ds.bucket_max_side,
                                ds.bucketing, key)
        problems.extend(settings)
        if errors(settings):
            continue
        index = index_dataset(ds, key, video=video)
        problems.extend(index.problems)
        buckets = _buckets(ds, key, index.items, video, problems)
        frames = [max(1, len(item.frames)) for item in index.items] if video else []
        summary = DatasetSummary(ds.id, len(index.items), buckets, frames, ds.regularization,
                                 controls=max((len(i.controls) for i in index.items), default=0),
                                 audio=_audio_count(cfg, ds, index.items))
        summaries.append(summary)
        sources.append(SourceDataset(ds.id, summary.keys, ds.repeats, ds.probability,
                                     ds.regularization))
    if not sources or not any(s.item_buckets for s in sources):
        return summaries, None
    try:
        sampler = MultiDatasetSampler(
            sources, batch_size=cfg.train.batch_size, grad_accum=cfg.train.grad_accum,
            num_processes=cfg.launch.num_processes * cfg.launch.num_machines,
            process_index=0, seed=cfg.train.seed)
    except ValueError:  # settings already reported by validate_config
        return summaries, None
    for summary, counts in zip(summaries, sampler.dataset_summaries(), strict=True):
        summary.per_epoch = counts.items_per_epoch
    return summaries, sampler.steps_per_epoch()


def _buckets(ds: Any, key: str, items: list[Any], video: bool,
             problems: list[Problem]) -> list[tuple[int, int]]:
    """Each item's bucket; warnings (into `problems`) for upscaled items and, under
    datasets.N.flip, for captions that name a side."""
    from core.data.buckets import bucket_for, is_upscaled
    from core.data.tags import mirrored_captions

    buckets, upscaled = [], []
    for item in items:
        b = bucket_for(item.width, item.height, ds.resolution, ds.bucketing, ds.crop,
                       ds.bucket_min_side, ds.bucket_max_side)
        buckets.append((b.width, b.height))
        if is_upscaled(item.width, item.height, b):
            upscaled.append(item.path)
    if upscaled:
        kind = "image(s) or clip(s)" if video else "image(s)"
        problems.append(warning(f"{key}.images", f"{len(upscaled)} {kind} are smaller "
                                f"than their {ds.resolution}px bucket and get upscaled "
                                f"(blurry), e.g. {upscaled[0]}"))
    sided = mirrored_captions([item.caption for item in items]) if ds.flip else 0
    if sided:
        problems.append(warning(f"{key}.flip", f"{sided} caption(s) say left or right, "
                                "which a mirrored image contradicts; turn flip off for "
                                "this dataset or reword them"))
    return buckets


def regularization_lines(datasets: list[DatasetSummary]) -> list[str]:
    """How many class images each epoch draws beside the training images (DreamBooth's
    prior preservation uses about as many of each; `repeats` sets the mix)."""
    prior = sum(ds.per_epoch for ds in datasets if ds.regularization)
    if not any(ds.regularization for ds in datasets):
        return []
    subject = sum(ds.per_epoch for ds in datasets if not ds.regularization)
    return [f"regularization: {prior} class image(s) per epoch beside {subject} training "
            "image(s), their loss weighted by train.prior_loss_weight; set the "
            "datasets' repeats to change that mix"]


def logging_problems(cfg: Config) -> list[Problem]:
    """The trackers' packages: W&B asked for and not installed is an error (the user asked
    for a dashboard that would stay empty); TensorBoard, on by default, a warning."""
    from importlib.util import find_spec

    from core.train.trackers import TENSORBOARD_MISSING, WANDB_MISSING

    problems = []
    if cfg.logging.wandb_project and find_spec("wandb") is None:
        problems.append(error("logging.wandb_project", WANDB_MISSING))
    if cfg.logging.tensorboard and find_spec("tensorboard") is None:
        problems.append(warning("logging.tensorboard", TENSORBOARD_MISSING))
    return problems


def optimizer_problems(cfg: Config) -> list[Problem]:
    """The optimizer's package, found here rather than seconds into a run (the trainer
    imports it only after loading the model)."""
    from importlib.util import find_spec

    from core.config.optimizers import OPTIMIZERS

    name = cfg.train.optimizer
    spec = OPTIMIZERS.get(name)
    if spec is None or find_spec(spec.module.split(".")[0]) is not None:
        return []
    return [error("train.optimizer", spec.missing(name))]


def init_lora_problems(cfg: Config) -> list[Problem]:
    """train.init_lora (a resolved path): a plain LoRA file, of the run's rank, on a LoRA
    run. The targets are compared when the trainer loads it (that needs the model)."""
    if not cfg.train.init_lora:
        return []
    from core.models.init_lora import InitLoraError, lora_file_rank

    key = "train.init_lora"
    if cfg.train.method != "lora" or cfg.train.lora_kind != "lora":
        return [error(key, "starts a plain LoRA run only; set train.method = \"lora\" and "
                           "train.lora_kind = \"lora\", or clear train.init_lora")]
    try:
        rank = lora_file_rank(cfg.train.init_lora)
    except InitLoraError as exc:
        return [error(key, str(exc).removeprefix(f"{key}: "))]
    if rank != cfg.train.lora_rank:
        return [error(key, f"{cfg.train.init_lora} has rank {rank} but train.lora_rank is "
                           f"{cfg.train.lora_rank}; set train.lora_rank = {rank}")]
    return []


def validation_file_problems(cfg: Config) -> list[Problem]:
    """validation.control_images (resolved) of an edit family, or of an image-to-video
    model (each prompt's first image), decoded now: the run would otherwise stop at its
    first validation, after loading and training, on a file the config names (a preset's
    example path left in)."""
    from core.data.controls import validation_control_problems
    from core.models.registry import family_or_defaults

    family = family_or_defaults(cfg.model.family)
    entries, prompts = cfg.validation.control_images, cfg.validation.prompts
    if family.first_image and not family.edit:
        return first_image_problems(cfg, family)
    if not prompts or not family.edit:
        return []
    return validation_control_problems(entries, prompts)


def first_image_problems(cfg: Config, family: Any) -> list[Problem]:
    """validation.control_images of a family with image-to-video models (its
    `first_image` spec): one first image per prompt for such a model, which samples from
    the synthetic first image without one; ignored (a warning) for a text-to-video model."""
    from core.data.controls import split_controls, validation_control_problems

    key, entries = "validation.control_images", cfg.validation.control_images
    prompts = cfg.validation.prompts
    if not family.first_image.takes_first_image(cfg.model):
        switch = family.first_image.switch
        how = (f"set {switch} for each prompt to start from its image there" if switch
               else "an image-to-video model takes a first image per prompt there")
        what = "runs text-to-video here" if switch else "is a text-to-video model"
        return [warning(key, f"is ignored: {cfg.model.path} {what}; {how}")] \
            if entries else []
    if not prompts or not entries:
        return []
    if len(entries) != len(prompts) or any(len(split_controls(e)) != 1 for e in entries):
        return [error(key, f"has {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} "
                           f"for {len(prompts)} validation prompt(s): give one first image "
                           "per prompt, in order, for the image-to-video model to start "
                           "from (or none, for a synthetic one)")]
    return validation_control_problems(entries, prompts)


def run_check(cfg: Config, workspace: str | Path, estimate: bool = True) -> CheckReport:
    """Every problem and the summary; `estimate`: with the memory estimate (it reads the
    model's configs, a second or more: views that re-check on each edit leave it out)."""
    workspace = Path(workspace).expanduser().absolute()
    from core.cache.status import caches_complete
    from core.memory.estimate import estimate_memory
    from core.memory.host import host_memory_problems
    from core.memory.swap import machine_ram_bytes, swap_problems
    from core.models.loading import check_model_config, check_model_source
    from core.train.validation_model import model_problems as validation_model_problems

    problems = validate_config(cfg)
    full = resolved(cfg, workspace)
    model_ok = not any(p.where.startswith("model.") for p in problems)
    if model_ok:
        source = check_model_source(full.model.path, cfg.model.family,
                                    workspace=workspace)
        problems += source
        if not source:  # model.path is usable: do its configs and target fit?
            problems += check_model_config(full.model.path, full.model.config,
                                           cfg.model.family, cfg.model.prediction_type)
        problems += _quantize_problems(cfg, full)
        problems += validation_model_problems(full, workspace)
    problems += check_directory_conflicts(full)
    problems += logging_problems(cfg)
    problems += optimizer_problems(cfg)
    problems += init_lora_problems(full) + training_adapter_problems(full)
    problems += validation_file_problems(full)
    datasets, steps = _summarise(full, problems)
    memory = None
    if estimate and not any(p.where.startswith("model.") for p in errors(problems)):
        memory = estimate_memory(full, workspace, [b for ds in datasets for b in ds.buckets],
                                 caches_built=caches_complete(full, workspace))
        problems += swap_problems(cfg, memory)
        if memory is not None and memory.ram is None:  # a GPU run: its host line counts
            problems += host_memory_problems(cfg, memory, machine_ram_bytes())
    return CheckReport(problems, datasets, steps, memory, text_notes(cfg))


def _quantize_problems(cfg: Config, full: Config) -> list[Problem]:
    """model.quantize's problems, for the scheme the run uses: a file of fp8 weights
    implies "fp8" (core/models/comfy_file.py), which the messages then say."""
    import dataclasses

    from core.models.quantize import quantize_problems

    found = quantize_problems(full.model.quantize)
    if full.model.quantize == cfg.model.quantize:
        return found
    why = (f"model.path holds fp8 weights, so this LoRA run keeps them in fp8 "
           f"(model.quantize = \"{full.model.quantize}\" unless it names another scheme): ")
    return [dataclasses.replace(p, message=why + p.message, hint=None) for p in found]


def text_notes(cfg: Config) -> list[str]:
    """Which captions bypass the text cache and are encoded at train time (the text
    encoders then stay on the training device), and what caption dropout caches."""
    if cfg.train.text_encoder_lora:
        return ["train.text_encoder_lora: the text encoders train, so the text cache is "
                "not used: every caption is encoded at train time, with gradients"]
    out = [f"datasets.{i}.shuffle_tags: dataset '{ds.id}' shuffles its tags per sample, "
           "so its captions are not cached: they are encoded at train time (the text "
           "encoder(s) stay loaded on the training device)"
           for i, ds in enumerate(cfg.datasets) if ds.shuffle_tags]
    if cfg.train.caption_dropout > 0:
        out.append(f"train.caption_dropout: {cfg.train.caption_dropout:g} of the samples "
                   "train on the empty caption (cached once)")
    return out + [line for line in [preserve_line(cfg)] if line]

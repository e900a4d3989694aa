"""Building what the loop needs: trainable weights, optimizer, schedule, EMA, data."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.cache.dataset import CachedDataset, cached_datasets
from core.cache.plan import MaskJob, TextJob, VaeJob
from core.cache.stage import build_caches
from core.config import Config
from core.config.streaming import stream_fallback
from core.data.sampler import MultiDatasetSampler
from core.models.components import GuidedComponents
from core.models.loading import resolve_dtype
from core.models.modules import (
    cast_encoders,
    memory_trace,
    move_encoders,
    release_device_memory,
)
from core.models.quantize import quantized_layers
from core.startup import load_model, process_group
from core.train.compiling import CompileWatch, attention_line, compile_blocks
from core.train.errors import TrainingError
from core.train.memory import MemoryTracker
from core.train.routing import start_routing
from core.train.swapping import loading_line, place_for_training, start_swapping
from core.train.texts import TrainTexts, make_train_texts
from core.train.validation import ValidationTexts, encode_validation_prompts

if TYPE_CHECKING:
    from core.models.base import Components, ModelFamily
    from core.models.routing import TokenRouter


@dataclasses.dataclass
class Setup:
    accelerator: Any
    family: ModelFamily
    components: Components  # denoiser is the prepared (possibly DDP-wrapped) model
    base_denoiser: Any  # the unwrapped module, for saving
    params: list[Any]  # trainable parameters
    optimizer: Any
    lr_scheduler: Any
    ema: Any | None
    datasets: list[CachedDataset]
    sampler: MultiDatasetSampler
    weight_dtype: Any
    validation_texts: ValidationTexts | None
    memory: MemoryTracker
    texts: TrainTexts
    # Text encoders a LoRA trains (the unwrapped modules, for saving), or none.
    trained_encoders: list[Any] = dataclasses.field(default_factory=list)
    # launch.distributed = "fsdp": the denoiser's class before sharding (for the
    # unsharded copy model/ is saved from), else None (core/train/sharding.py).
    sharded_class: type | None = None
    # train.compile = "blocks": what reports the compiles (core/train/compiling.py).
    compiled: CompileWatch | None = None
    # train.token_routing: the router each micro-step arms (core/models/routing.py).
    router: TokenRouter | None = None


def _adapter(cfg: Config, targets: list[str]) -> Any:
    """The peft config of train.lora_kind (lora, dora, lokr, loha) at the run's rank and
    alpha (core/models/adapters.py)."""
    from core.models.adapters import adapter_config

    return adapter_config(cfg.train.lora_kind, cfg.train.lora_rank,
                          cfg.train.lora_alpha or cfg.train.lora_rank, targets)


def add_trainable(family: ModelFamily, denoiser: Any, cfg: Config) -> list[Any]:
    """Adapter layers (train.lora_kind) on the family's targets, in fp32 on a frozen base
    already in the compute dtype (loaded so, as diffusers' examples do), or the whole
    denoiser, in fp32, for a full fine-tune."""
    import torch

    denoiser.requires_grad_(False)
    if cfg.train.method == "lora":
        with _quiet_peft_merge_warning():
            denoiser.add_adapter(_adapter(cfg, family.lora_target_modules(
                cfg.train.lora_targets)))
        for param in denoiser.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.float32)
    else:
        denoiser.requires_grad_(True)
    if cfg.train.gradient_checkpointing:
        denoiser.enable_gradient_checkpointing()
    denoiser.train()
    return [p for p in denoiser.parameters() if p.requires_grad]


def start_from_lora(denoiser: Any, cfg: Config, reporter: Any) -> None:
    """train.init_lora: the file's LoRA into the new adapter, before the optimizer sees
    it (a resume then overwrites it with the checkpoint's weights)."""
    if not cfg.train.init_lora or cfg.train.method != "lora":
        return
    from core.models.init_lora import InitLoraError, load_init_lora

    try:
        skipped = load_init_lora(denoiser, cfg.train.init_lora)
    except InitLoraError as exc:
        raise TrainingError(str(exc)) from None
    reporter.say(f"started from LoRA {cfg.train.init_lora}")
    if skipped:
        reporter.say(f"note: train.init_lora: {skipped} text-encoder tensor(s) in the file "
                     "were not loaded (only the denoiser's LoRA starts the run)")


def add_text_encoder_lora(family: ModelFamily, components: Components, cfg: Config) -> list[Any]:
    """train.text_encoder_lora: the denoiser's adapter (kind, rank and alpha) on every
    text encoder's attention, fp32 weights on the frozen encoder, as diffusers'
    train_dreambooth_lora examples do. Returns the new trainable parameters."""
    import torch

    if not cfg.train.text_encoder_lora:
        return []
    targets = family.text_encoder_lora_targets
    if not targets:  # the config check refuses this first; a clear error all the same
        raise TrainingError(f"train.text_encoder_lora is not supported for "
                            f"{family.name}; set it to false")
    params = []
    for encoder in components.text_encoders:
        encoder.add_adapter(_adapter(cfg, list(targets)))
        for param in encoder.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.float32)
                params.append(param)
    return params


@contextlib.contextmanager
def _quiet_peft_merge_warning() -> Iterator[None]:
    """peft warns that a LoRA on a torchao-quantized layer cannot be merged; training
    never merges (the saved LoRA is the adapter alone), so the warning only alarms."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*get_apply_tensor_subclass.*")
        yield


def make_optimizer(params: list[Any], cfg: Config, text_params: list[Any] | None = None) -> Any:
    """train.optimizer over the denoiser's weights and, in a second group, the text
    encoders' (train.text_encoder_lr, or the main rate when 0)."""

    groups: Any = params
    if text_params:
        groups = [{"params": params},
                  {"params": text_params,
                   "lr": cfg.train.text_encoder_lr or cfg.train.learning_rate}]
    return _optimizer(groups, cfg)


def _optimizer(params: Any, cfg: Config) -> Any:
    """train.optimizer with its option keys (core/train/optimizers.py)."""
    from core.train.optimizers import OptimizerUnavailable, build_optimizer

    try:
        return build_optimizer(params, cfg.train)
    except OptimizerUnavailable as exc:
        raise TrainingError(str(exc)) from None


def apply_objective(family: ModelFamily, components: Components, cfg: Config) -> None:
    """The run's flow-matching choices and training guidance onto the loaded model (the
    config check has refused them for families they do not apply to). "auto" and 0 stay
    None: the family's own default."""
    from core.models.modules import unwrap
    from core.models.objectives import FlowTraining

    t = cfg.train
    auto = None if t.timestep_sampling == "auto" else t.timestep_sampling
    components.flow = FlowTraining(
        timestep_sampling=auto, logit_mean=t.logit_mean, logit_std=t.logit_std,
        mode_scale=t.mode_scale, shift=t.flow_shift or None,
        loss_weighting=None if t.loss_weighting == "auto" else t.loss_weighting)
    if not t.guidance:
        return
    guided = isinstance(components, GuidedComponents)
    if not guided or not getattr(unwrap(components.denoiser).config, "guidance_embeds", False):
        raise TrainingError(f"train.guidance = {t.guidance:g}, but {cfg.model.path} is not "
                            f"guidance-distilled (its {family.name} transformer has no "
                            "guidance embedding); set train.guidance = 0")
    components.guidance = t.guidance


def configure_run(family: ModelFamily, components: Components, cfg: Config) -> None:
    """The family's own run settings (ModelFamily.configure_run) before the adapter is
    added; one the loaded model cannot take stops the run with the family's message."""
    try:
        family.configure_run(components, cfg)
    except ValueError as exc:
        raise TrainingError(str(exc)) from None


def make_lr_scheduler(optimizer: Any, cfg: Config) -> Any:
    """Stepped once per optimizer step by the loop (not by accelerate)."""
    from diffusers.optimization import get_scheduler

    return get_scheduler(cfg.train.lr_scheduler, optimizer,
                         num_warmup_steps=cfg.train.lr_warmup_steps,
                         num_training_steps=cfg.train.max_steps,
                         num_cycles=cfg.train.lr_cycles, power=cfg.train.lr_power)


def make_rebuild(family: ModelFamily, components: Components) -> Any:
    """Rebuild one cache entry that failed to load at train time."""
    from core.cache.build import (
        build_mask_entries,
        build_text_entries,
        build_vae_entries,
        encode_kwargs,
    )

    vae_encoders, text_encoders = encode_kwargs(family, components)

    def rebuild(job: VaeJob | TextJob | MaskJob) -> None:
        if isinstance(job, MaskJob):
            build_mask_entries([job])
        elif isinstance(job, VaeJob):
            build_vae_entries(jobs=[job], device=components.vae.device,
                              dtype=components.vae.dtype, **vae_encoders)
        else:
            build_text_entries(jobs=[job], **text_encoders)

    return rebuild


def prepare_data(cfg: Config, family: ModelFamily, components: Components, accelerator: Any,
                 say: Any) -> tuple[list[CachedDataset], MultiDatasetSampler, TrainTexts]:
    report = build_caches(cfg, family, components, process_group(accelerator))
    for line in report.lines():
        say(line)
    for problem in report.problems:
        say(str(problem))
    datasets = cached_datasets(cfg, report.plan, make_rebuild(family, components))
    empty = [ds.id for ds in datasets if len(ds) == 0 and ds.probability > 0]
    if empty or not datasets:
        raise TrainingError(f"no cached images for dataset(s) {', '.join(empty)}: every image "
                            "was skipped; run --stage check to see why")
    sampler = MultiDatasetSampler([ds.source() for ds in datasets],
                                  batch_size=cfg.train.batch_size,
                                  grad_accum=cfg.train.grad_accum,
                                  num_processes=accelerator.num_processes,
                                  process_index=accelerator.process_index, seed=cfg.train.seed)
    if accelerator.num_processes > 1:
        from core.train.agreement import check_same_data, ranks_of

        check_same_data(cfg, datasets, sampler, components.fingerprint,
                        ranks_of(accelerator, cfg))
    texts = make_train_texts(cfg, family, [ds.text_at_train_time for ds in report.plan.datasets],
                             _empty_caption(report.plan, datasets), accelerator.process_index)
    return datasets, sampler, texts


def _empty_caption(plan: Any, datasets: list[CachedDataset]) -> dict[str, Any] | None:
    """The cached empty caption's entry (planned when caption dropout is on), kept in
    memory: every dropped sample of a cached dataset uses it."""
    job = next((job for job in plan.text_jobs if job.caption == ""), None)
    return None if job is None or not datasets else datasets[0].load_text(job)


def load_and_place(cfg: Config, workspace: Path, accelerator: Any, reporter: Any,
                   memory: MemoryTracker) -> tuple[ModelFamily, Components,
                                                    list[CachedDataset], MultiDatasetSampler,
                                                    ValidationTexts | None, TrainTexts]:
    """Load every part in the dtype it runs in, on the CPU (a streamed denoiser waits on
    the meta device: config/streaming.py); build the caches and encode the validation
    prompts with the text encoders and VAE on the GPU; send those back to the CPU; then
    bring the denoiser (quantized on the way when asked) to the GPU, a layer at a time
    from its source when it streams. Only the denoiser and what trains it stay on the
    GPU while training."""
    import torch

    weight_dtype = resolve_dtype(accelerator.mixed_precision)
    full = cfg.train.method == "full"  # trainable weights stay fp32, as in diffusers' examples
    fallback = stream_fallback(cfg)
    family, c = load_model(cfg, workspace, accelerator, device="cpu",
                           dtype=torch.float32 if full else weight_dtype,
                           stream_denoiser=fallback is None)
    reporter.say(loading_line(c, fallback))
    fuse_training_adapters(c, cfg, reporter)
    if full:
        cast_encoders(c, weight_dtype)
    elif c.denoiser_stream is None and c.denoiser.dtype != weight_dtype:  # kept stored dtype
        c.denoiser.to(dtype=weight_dtype)
    reporter.memory(memory.snapshot("loaded"))
    reporter.phase_done("model")
    move_encoders(c, accelerator.device, cfg.model.stream_text_encoders)
    memory_trace("encoders placed")
    datasets, sampler, train_texts = prepare_data(cfg, family, c, accelerator, reporter.say)
    reporter.phase_done("caches")
    texts = encode_validation_prompts(family, c, cfg.validation)
    memory_trace("validation prompts encoded")
    if train_texts.encoders_needed:  # captions encoded at train time: the encoders stay
        c.vae.to("cpu")
    else:
        move_encoders(c, "cpu")
    release_device_memory(accelerator.device)
    memory_trace("encoders back on the CPU")
    place_for_training(family, c, cfg, accelerator.device)
    memory_trace("denoiser placed")
    if cfg.model.quantize != "none":
        _report_quantized(cfg.model.quantize, c.denoiser, reporter)
    reporter.memory(memory.snapshot("cached"))
    return family, c, datasets, sampler, texts, train_texts


def fuse_training_adapters(c: Components, cfg: Config, reporter: Any) -> None:
    """model.training_adapter into the loaded base's weights, before its dtype and
    placement; the trainer then adds what it trains on top."""
    if not cfg.model.training_adapter:
        return
    from core.models.training_adapter import TrainingAdapterError, fuse_adapters

    try:
        changed = fuse_adapters(c.denoiser, cfg.model.training_adapter)
    except TrainingAdapterError as exc:
        raise TrainingError(str(exc)) from None
    after = "with it" if cfg.validation.with_training_adapter else "without it"
    reporter.say(f"training adapter: {len(cfg.model.training_adapter)} file(s), {changed} "
                 f"module(s) fused into the base for training only (not saved; validation "
                 f"samples {after})")


def _report_quantized(scheme: str, denoiser: Any, reporter: Any) -> None:
    """A `quantized` event and a log line: what the denoiser's weights hold after
    quantize_frozen, counted from the weights themselves."""
    found = quantized_layers(denoiser)
    reporter.event("quantized", scheme=scheme, **found)
    kinds = ", ".join(f"{n} {kind}" for kind, n in found["weight_types"].items()) or "none"
    reporter.say(f"model.quantize {scheme}: {found['quantized']} of {found['linear_layers']} "
                 f"linear layers of the denoiser quantized ({kinds})")


def build_setup(cfg: Config, workspace: Path, accelerator: Any, reporter: Any) -> Setup:
    memory = MemoryTracker(accelerator.device)
    family, components, datasets, sampler, texts, train_texts = load_and_place(
        cfg, workspace, accelerator, reporter, memory)
    apply_objective(family, components, cfg)
    configure_run(family, components, cfg)
    base = components.denoiser
    params = add_trainable(family, base, cfg)
    swappers = start_swapping(family, base, cfg, accelerator.device, reporter)
    start_from_lora(base, cfg, reporter)
    compiled = compile_blocks(family, base, cfg.train.compile, reporter.say)
    router = start_routing(family, base, cfg, reporter)
    attention = attention_line(base, resolve_dtype(accelerator.mixed_precision),
                               accelerator.device)
    if attention:
        reporter.say(attention)
    text_params = add_text_encoder_lora(family, components, cfg)
    trained = list(components.text_encoders) if text_params else []
    optimizer = make_optimizer(params, cfg, text_params)
    params = params + text_params
    lr_scheduler = make_lr_scheduler(optimizer, cfg)
    ema = None
    if cfg.train.ema:
        from diffusers.training_utils import EMAModel

        ema = EMAModel(params, decay=cfg.train.ema_decay)
        ema.to(accelerator.device)
    # Trained text encoders are prepared beside the denoiser (DDP keeps their LoRA in
    # step across processes); the components then call the prepared modules.
    model_class = type(base)
    # The swapped blocks stay where the swappers keep them: no device placement for them.
    placement = [False if swappers else None, *[None] * len(trained), None]
    model, *encoders, optimizer = accelerator.prepare(base, *trained, optimizer,
                                                      device_placement=placement)
    sharded = _sharded(accelerator)
    if sharded:  # fully_shard put new (DTensor) parameters in place of the old ones
        params = [p for p in model.parameters() if p.requires_grad]
    components = dataclasses.replace(components, denoiser=model,
                                     text_encoders=encoders or components.text_encoders)
    return Setup(accelerator, family, components, base, params, optimizer, lr_scheduler, ema,
                 datasets, sampler, resolve_dtype(accelerator.mixed_precision), texts,
                 memory, train_texts, trained, model_class if sharded else None, compiled,
                 router)


def _sharded(accelerator: Any) -> bool:
    from core.train.sharding import is_sharded

    return is_sharded(accelerator)

"""What a run needs on each GPU, estimated before launch from the model's configs alone
(no weights loaded): frozen weights, trainable parameters, gradients and optimizer states
exactly, activations as an estimate. `--stage check` and the Training tab print it.

Three phases, as the trainer runs them (core/train/setup.py): first the caches are built
with the text encoders and the VAE on the GPU; they go back to the CPU, and only then
does the denoiser come to the GPU, with what trains it; between steps a validation round
brings the VAE back to decode. The per-GPU figure is the largest phase. A CPU run
(launch.cpu) holds every part in RAM at once.

core/memory/model_counts.py reads the sizes (meta-device components from their configs);
core/memory/activations.py holds the activation formulas and their coefficients.
This module reads the whole config and the caches' state, so it sits above both, beside
the check, not in core/models.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config.optimizers import OPTIMIZERS
from core.config.prompts import largest_size
from core.memory.advice import lower_memory_settings
from core.memory.gpu_probe import cuda_available, detect_gpu
from core.memory.host import host_encoders, loading_parts, training_host_parts
from core.memory.report import CUDA_CONTEXT, GIB, MemoryEstimate, MemoryPart
from core.memory.step import (
    FP32,
    base_output_name,
    preserve_bytes,
    shape_text,
    step_frames,
    step_pixels,
    step_shape,
)
from core.memory.swap import host_parts, swapped_bytes
from core.models.quantize import frozen_bytes
from core.models.registry import family_or_defaults
from core.notices import quiet_libraries

if TYPE_CHECKING:
    from core.config import Config
    from core.memory.activations import StepShape
    from core.memory.model_counts import ComponentSize, DenoiserSize, ModelSizes

# CUDA context, cuBLAS/cuDNN workspaces and allocator slack, per process. Calibrated on:
# nothing yet (a typical figure); recalibrate from measured H100 runs.
CUDA_CONTEXT_BYTES = GIB // 2
# Captions are encoded this many at a time (core/cache/build.py's text batch_size); images
# as many as core.models.modules.vae_batch_size allows for their size.
CACHE_TEXT_BATCH = 16
CLIP_TOKENS = 77


# ---------------------------------------------------------------- the estimate


def estimate_memory(cfg: Config, workspace: Path,
                    buckets: list[tuple[int, int]] | None = None, *,
                    caches_built: bool) -> MemoryEstimate | None:
    """The per-GPU estimate for `cfg` (paths resolved). When the model's configs cannot
    be read without a download (a hub id not in the HF cache) or at all, an estimate
    whose `unknown` says why, and no parts. None when a key it reads is invalid (the check
    names that key; an estimate of a config that cannot run would only add noise).

    `buckets`: the (width, height) of every image the run trains on, as the check
    assigns them; the activations are estimated at the largest. Without them, at each
    dataset's square bucket (its resolution rounded down to a multiple of 64). With every
    cache built (`caches_built`: the caller looks that up, core/cache/status.py) there is
    no caching phase to estimate; the estimate reads no dataset and no cache itself.
    `workspace`: where tiny models are built and random ones resolved."""
    from core.memory.config_source import UnknownModel, config_source
    from core.memory.sizes_cache import cached_sizes, kept_key, read_and_keep

    if _invalid_for_estimate(cfg):
        return None
    settings = (cfg.train.lora_rank, cfg.train.lora_targets, cfg.train.method == "lora",
                cfg.train.lora_kind)
    try:  # read before: without diffusers imported, this check takes a second less than 5
        key = kept_key(cfg.model.path, cfg.model.family, Path(workspace), settings)
        sizes = cached_sizes(key)
        if sizes is None:
            with quiet_libraries(), \
                    config_source(cfg.model.path, cfg.model.family, Path(workspace)) as source:
                sizes = read_and_keep(source, settings, key)
    except UnknownModel as exc:
        return MemoryEstimate(unknown=str(exc))
    except Exception as exc:  # noqa: BLE001 - the estimate never stops a check
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        return MemoryEstimate(unknown=f"cannot read the model's configs: "
                                      f"{type(exc).__name__}: {first}")
    estimate = assemble(cfg, sizes, planned_gpu(cfg) or (
        None if cfg.launch.cpu else detect_gpu()), step_pixels(cfg, buckets))
    estimate.planned = bool(cfg.launch.gpu_memory_gib)
    if not cfg.launch.cpu and not cuda_available() and not estimate.planned:
        estimate.ram = [p for p in estimate.parts if p.name != CUDA_CONTEXT] + [
            p for p in estimate.caching if p.name in ("text encoders", "VAE")]
    if caches_built:
        estimate.caching = []
    return estimate


def planned_gpu(cfg: Config) -> tuple[int, str] | None:
    """launch.gpu_memory_gib's card: (bytes, how the lines name it), or None for 0."""
    gib = cfg.launch.gpu_memory_gib
    return (int(gib * GIB), "launch.gpu_memory_gib") if gib else None


# Keys the estimate reads: an error on one of them (train.lora_rank = 0) skips it.
ESTIMATE_SECTIONS = ("model", "train", "launch")


def _invalid_for_estimate(cfg: Config) -> bool:
    from core.config import validate_config
    from core.problems import errors

    def read(where: str) -> bool:
        parts = where.split(".")
        return parts[0] in ESTIMATE_SECTIONS or parts[0] == "datasets" and parts[-1] == (
            "resolution")

    return any(read(p.where) for p in errors(validate_config(cfg)))


def assemble(cfg: Config, sizes: ModelSizes, gpu: tuple[int, str] | None,
             pixels: tuple[int, int] | None = None, plan_swap: bool = True) -> MemoryEstimate:
    """The estimate from the sizes; `gpu` is (total bytes, name) of the GPU it runs on;
    `pixels` (width, height) of the largest step (step_pixels(cfg) when None);
    `plan_swap`: look for the smallest model.blocks_to_swap that fits `gpu`."""
    pixels = pixels or step_pixels(cfg)
    wbytes = weight_bytes(cfg.train.mixed_precision)
    shape = step_shape(cfg, sizes, pixels)
    training = training_parts(cfg, sizes.denoiser, wbytes, sizes.second_expert)
    training.append(MemoryPart("activations", activation_bytes(sizes, shape), exact=False))
    if preserve_bytes(cfg, shape):  # one extra no-grad forward: its output is all it keeps
        training.append(MemoryPart(base_output_name(cfg), preserve_bytes(cfg, shape), False))
    copies = dequantized_copy_bytes(cfg, sizes.denoiser, wbytes)
    if copies:
        training.append(MemoryPart("dequantized weights", copies))
    encoders = [MemoryPart("text encoders", _text_encoder_bytes(cfg, sizes, wbytes)),
                MemoryPart("VAE", _weights([sizes.vae] if sizes.vae else [],
                                           _vae_bytes(cfg, sizes.vae, wbytes)))]
    estimate = MemoryEstimate(shape=shape_text(pixels, shape, step_frames(cfg)),
                              cpu=cfg.launch.cpu, advice=lower_memory_settings(cfg))
    if cfg.launch.cpu:
        estimate.parts = training + encoders
        return estimate
    context = MemoryPart(CUDA_CONTEXT, CUDA_CONTEXT_BYTES, exact=False)
    estimate.parts = [*training, context]
    encoding = MemoryPart("encoding", caching_activation_bytes(cfg, sizes, pixels),
                          exact=False)
    estimate.caching = [*encoders, encoding, context]
    if cfg.validation.prompts:
        estimate.validation = [*validation_parts(cfg, sizes, training, encoders[1]), context]
        width, height = largest_size(cfg.validation)
        estimate.validation_shape = f"validation images {width}x{height}"
        if estimate.dominant == "validation":
            estimate.advice.insert(0, "a lower validation.resolution")
    if gpu is not None:
        estimate.device_total_bytes, estimate.device_name = gpu
    _plan_swap(cfg, sizes, estimate, wbytes,
               (lambda c, s: assemble(c, s, gpu, pixels, plan_swap=False)) if plan_swap
               else None)
    held = host_encoders(sizes, wbytes, encoders[1])
    estimate.host_loading = loading_parts(cfg, sizes, wbytes, held, estimate.host)
    estimate.host_training = training_host_parts(cfg, held, estimate.host)
    return estimate


def _plan_swap(cfg: Config, sizes: ModelSizes, estimate: MemoryEstimate, wbytes: int,
               replan: Any) -> None:
    """model.blocks_to_swap's share: the pinned host memory and the block count; and when
    the estimate is over its card, the settings that fit as the first advice
    (core/memory/fit.py)."""
    from core.memory.fit import fitting_plan

    experts = [sizes.denoiser] + ([sizes.second_expert] if sizes.second_expert else [])
    estimate.host = host_parts(cfg, swapped_bytes(cfg, experts, wbytes)[0], len(experts))
    estimate.max_blocks = len(sizes.denoiser.blocks) or None
    plan = fitting_plan(cfg, sizes, estimate, replan) if replan else None
    if plan is not None:
        estimate.fit = plan
        estimate.advice = [a for a in estimate.advice if not any(k in a for k in plan.changes)]
        card = (estimate.device_total_bytes or 0) / GIB
        estimate.advice.insert(0, f"{plan.label()} fits {card:.0f} GiB: "
                                  f"{plan.per_gpu_bytes / GIB:.1f} GiB per GPU, "
                                  f"{plan.host_pinned_bytes / GIB:.0f} GiB host RAM")


def validation_parts(cfg: Config, sizes: ModelSizes, training: list[MemoryPart],
                     vae: MemoryPart) -> list[MemoryPart]:
    """A validation round between steps: the weights and optimizer states stay, the
    gradients are gone (set to None after each step) but for DDP's buckets with more
    than one process, the VAE comes to decode, and the sampling and decode at
    the largest validation size take their own share; validation.model's denoiser with
    the run's LoRA comes beside the trained one, whole (block swap does not reach it)."""
    from core.memory import activations as act

    processes = cfg.launch.num_processes * cfg.launch.num_machines
    kept = [p if p.name != "gradients" else MemoryPart(p.name, p.bytes // 2)
            for p in training if p.name not in ("activations", "dequantized weights")
            and (p.name != "gradients" or processes > 1)]
    video = family_or_defaults(cfg.model.family).video
    frames = min(cfg.validation.frames, 4) if video else 1  # a video decodes in chunks
    width, height = largest_size(cfg.validation)
    config = sizes.vae.config if sizes.vae else {}
    decode = act.validation_bytes(config, height, width, frames,
                                  weight_bytes(cfg.train.mixed_precision))
    out = [*kept, vae, MemoryPart("sampling and decode", decode, exact=False)]
    if cfg.validation.model:  # its denoiser (sized as the trained one's) and the LoRA
        lora = sum(p.bytes for p in training if p.name == "trainable")
        out.append(MemoryPart("validation.model", lora + _weights(
            [sizes.denoiser], weight_bytes(cfg.train.mixed_precision)), exact=False))
    return out


def weight_bytes(mixed_precision: str) -> int:
    """Bytes of a frozen weight: the mixed-precision dtype's."""
    return 2 if mixed_precision in ("fp16", "bf16") else FP32


def _weights(components: list[ComponentSize], per_weight: int) -> int:
    return sum(c.floats * per_weight + c.other_bytes for c in components)


def _text_encoder_bytes(cfg: Config, sizes: ModelSizes, wbytes: int) -> int:
    """The text encoders on the GPU; model.stream_text_encoders leaves their repeated
    layers in host memory but for two (the one running, the one being copied)."""
    whole = _weights(sizes.text_encoders, wbytes)
    if not cfg.model.stream_text_encoders:
        return whole
    layers = sum(e.layer_floats for e in sizes.text_encoders)
    largest = max((e.largest_layer for e in sizes.text_encoders), default=0)
    return whole - (layers - 2 * largest) * wbytes


def _vae_bytes(cfg: Config, vae: ComponentSize | None, wbytes: int) -> int:
    """An fp16 VAE whose config asks for it encodes in float32 (core/models/modules.py)."""
    upcast = vae is not None and bool(vae.config.get("force_upcast"))
    return FP32 if cfg.train.mixed_precision == "fp16" and upcast else wbytes


def dequantized_copy_bytes(cfg: Config, d: DenoiserSize, wbytes: int) -> int:
    """What a LoRA step on a torchao-quantized base keeps of dequantized weights for
    its backward (DEQUANTIZED_FOR_BACKWARD): one block's, or all of them without
    gradient checkpointing."""
    from core.models.quantize import DEQUANTIZED_FOR_BACKWARD

    if cfg.train.method != "lora" or cfg.model.quantize not in DEQUANTIZED_FOR_BACKWARD:
        return 0
    checkpointing = cfg.train.gradient_checkpointing
    return (d.quantizable_in_a_block if checkpointing else d.quantizable) * wbytes


def training_parts(cfg: Config, d: DenoiserSize, wbytes: int,
                   second: DenoiserSize | None = None) -> list[MemoryPart]:
    """Frozen weights, trainable, gradients, optimizer, EMA: exact. LoRA and full
    fine-tunes keep trainable weights, their gradients and the optimizer's states in fp32; DDP
    (more than one process) copies the gradients into its buckets, once more. A second
    expert (`second`) is loaded too, and trains where the family says it does."""
    experts = [d] if second is None else [d, second]
    family = family_or_defaults(cfg.model.family)
    trained = experts[:family.experts.trained(cfg, len(experts))] if family.experts else experts
    if cfg.train.method == "lora":
        frozen = sum(frozen_bytes(e, cfg.model.quantize, wbytes) for e in experts)
        params = sum(e.lora for e in trained)
    else:
        frozen = sum(e.other_bytes for e in trained) + sum(
            frozen_bytes(e, "none", wbytes) for e in experts[len(trained):])
        params = sum(e.floats for e in trained)
    held, buffers = swapped_bytes(cfg, experts, wbytes)
    processes = cfg.launch.num_processes * cfg.launch.num_machines
    parts = [MemoryPart("frozen weights", frozen - held),
             MemoryPart("trainable", params * FP32),
             MemoryPart("gradients", params * FP32 * (2 if processes > 1 else 1)),
             MemoryPart("optimizer",
                        int(params * OPTIMIZERS[cfg.train.optimizer].state_bytes))]
    if cfg.train.ema:
        parts.append(MemoryPart("EMA", params * FP32))
    if buffers:
        parts.append(MemoryPart("swap buffers", buffers))
    return parts


# ---------------------------------------------------------------- activations


def text_tokens(family: str) -> int:
    """Text tokens an MMDiT attends to beside the image: the T5 length the family pads
    to, and SD3's CLIP tokens before them."""
    from core.models.registry import get_family

    spec = get_family(family)
    return int(spec.max_sequence_length or 0) + spec.memory.extra_text_tokens


def activation_bytes(sizes: ModelSizes, shape: StepShape) -> int:
    from core.memory import activations as act
    from core.models.registry import get_family

    d = sizes.denoiser
    if d.kind == "unet":
        return act.unet_activation_bytes(d.config, shape)
    # A family whose transformer config is not MMDiT-shaped (Z-Image) says how it counts.
    memory = get_family(sizes.family).memory
    if memory.activation_layout is not None:
        config, patch = memory.activation_layout(d.config)
    else:  # Flux, Chroma and FLUX.2 pack 2x2 latent patches themselves (patch_size 1)
        config = d.config
        patch = int(d.config.get("patch_size", 1) or 1) * memory.latent_packing
    return (act.mmdit_activation_bytes(config, shape, text_tokens(sizes.family), patch)
            + extra_stream_bytes(sizes.family, d.config, shape))


def extra_stream_bytes(family: str, config: dict[str, Any], shape: StepShape) -> int:
    """The activations of a second token stream the family's denoiser (transformer
    `config`) runs beside the image tokens (LTX-2's audio): the MMDiT formula over it, a
    token per latent; 0 for a family with none."""
    from core.memory import activations as act
    from core.models.registry import get_family

    stream = get_family(family).memory.extra_stream
    if stream is None:
        return 0
    stream_config, stream_shape = stream(config, shape)
    return act.mmdit_activation_bytes(stream_config, stream_shape, text_tokens(family), 1)


def caching_activation_bytes(cfg: Config, sizes: ModelSizes,
                             pixels: tuple[int, int] | None = None) -> int:
    """The larger of a VAE encode batch (of the largest bucket, `pixels`) and one text
    encoder's batch (they take turns)."""
    from core.memory import activations as act

    width, height = pixels or step_pixels(cfg)
    wbytes = weight_bytes(cfg.train.mixed_precision)
    peaks = [0]
    if sizes.vae is not None:
        from core.models.modules import vae_batch_size

        # a causal video VAE encodes a clip 4 frames at a time (AutoencoderKLWan._encode)
        frames = min(step_frames(cfg), 4)
        peaks.append(act.vae_encode_bytes(sizes.vae.config, height, width,
                                          vae_batch_size(width, height, frames) * frames,
                                          _vae_bytes(cfg, sizes.vae, wbytes)))
    from core.models.registry import get_family

    memory = get_family(sizes.family).memory
    for encoder in sizes.text_encoders:
        t5 = encoder.config.get("model_type") == "t5"
        # A decoder LM (the family says so: Z-Image's Qwen3) and a vision-language model
        # (Qwen-Image's Qwen2.5-VL, which keeps its language model's sizes apart) read
        # the family's text length, not their context window.
        lm = memory.text_encoder_kind == "llm"
        text_config = encoder.config.get("text_config") or {}
        tokens = text_tokens(sizes.family) if t5 or lm or text_config else int(
            encoder.config.get("max_position_embeddings", CLIP_TOKENS))
        if t5:  # the T5 encoder reads only its own tokens (SD3's CLIP ones come beside)
            tokens -= memory.extra_text_tokens
        peaks.append(act.text_encode_bytes({**encoder.config, **text_config}, tokens,
                                           CACHE_TEXT_BATCH, wbytes, eager_scores=t5))
    return max(peaks)

"""The sizes a memory estimate needs, read from a model's configs without loading weights.

Where the configs come from is config_source.py's; a single-file .safetensors gives the
tensor shapes in its header, with the architecture (LoRA layers, activations, and the
parts the file lacks) from the full-size configs of its family.

Each component is instantiated on the meta device from its config.json (accelerate's
init_empty_weights, buffers included: SD3's positional table is one), so the counts are
the model's own: parameters and buffers, the adapter's parameters as peft adds them (of
train.lora_kind: LoRA, DoRA, LoKr or LoHa), and the
weights `core.models.quantize.quantizable` picks.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.memory.config_source import ConfigSource, UnknownModel

DENOISERS = ("unet", "transformer")
SECOND_EXPERT = "transformer_2"  # a two-expert model's low-noise denoiser (Wan 2.2 A14B)
NF4_BLOCK = 64  # weights per fp32 absmax in bitsandbytes' nf4
# Original-format (A1111/ComfyUI) key prefixes of the parts a single file may bundle;
# every other tensor belongs to the denoiser.
VAE_PREFIXES = ("first_stage_model.", "vae.")
TEXT_PREFIXES = ("cond_stage_model.", "conditioner.", "text_encoders.", "text_encoder.")
_INT_BYTES = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass
class ComponentSize:
    name: str  # "unet", "vae", "text_encoder_2", ...
    config: dict[str, Any]
    floats: int  # floating-point parameters and buffers: stored in the weight dtype
    other_bytes: int = 0  # integer buffers, at their own size
    # A text encoder's repeated layers (block_swap.repeated_layers): all of them and the
    # largest one, in floats (model.stream_text_encoders keeps them in host memory).
    layer_floats: int = 0
    largest_layer: int = 0


@dataclass
class BlockSize:
    """One repeated block's frozen sizes (the fields quantize.frozen_bytes reads)."""

    floats: int = 0
    other_bytes: int = 0
    quantizable: int = 0
    quantizable_rows: int = 0
    quantizable_blocks: int = 0


@dataclass
class DenoiserSize(ComponentSize):
    quantizable: int = 0  # weights of the modules `quantizable` says yes to
    quantizable_rows: int = 0  # their output rows: one int8/fp8 scale each
    quantizable_blocks: int = 0  # their 64-weight blocks: one nf4 absmax each
    # The most quantizable weights in one block (the stack's unit: transformer_blocks.3,
    # a UNet's down_blocks.1): torchao dequantizes a whole block's for its backward.
    quantizable_in_a_block: int = 0
    lora: int = 0  # adapter parameters peft adds for the run's kind, rank and targets
    # Its repeated blocks (ModelFamily.block_lists), in forward order: model.blocks_to_swap
    # holds the first ones in host memory.
    blocks: list[BlockSize] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "unet" if self.name == "unet" else "mmdit"


@dataclass
class ModelSizes:
    family: str
    denoiser: DenoiserSize
    vae: ComponentSize | None
    text_encoders: list[ComponentSize] = field(default_factory=list)
    second_expert: DenoiserSize | None = None  # a two-expert model's transformer_2


# ---------------------------------------------------------------- counting


def read_sizes(source: ConfigSource, lora_rank: int, lora_scope: str,
               with_lora: bool, lora_kind: str = "lora") -> ModelSizes:
    """Every loaded component's size; the denoiser's quantizable weights and adapter
    (train.lora_kind). Read once per state of the configs (and the single file): a form
    edit that changes only the resolution or the batch asks again, and building a
    20 B model on the meta device takes a second."""
    sizes = _read_sizes(source.family, source.folder, source.file, _stamp(source),
                        lora_rank, lora_scope, with_lora, lora_kind)
    return copy.deepcopy(sizes)  # the caller's to change


def _stamp(source: ConfigSource) -> tuple[tuple[str, int, int], ...]:
    """The configs' (and the single file's) paths, sizes and modification times."""
    from core.models.source import INDEX_FILES

    paths = [*(source.folder / name for name in INDEX_FILES),
             *sorted(source.folder.glob("*/config.json"))]
    if source.file is not None:
        paths.append(source.file)
    stats = [(str(path), path.stat()) for path in paths if path.is_file()]
    return tuple((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats)


@functools.lru_cache(maxsize=16)
def _read_sizes(family: str, folder: Path, file: Path | None, stamp: tuple[Any, ...],
                lora_rank: int, lora_scope: str, with_lora: bool,
                lora_kind: str) -> ModelSizes:
    from core.models.source import index_file

    source = ConfigSource(family, folder, file)
    index_path = index_file(source.folder)
    if index_path is None:
        raise UnknownModel(f"no model_index.json in {source.folder}")
    index = json.loads(index_path.read_text(encoding="utf-8"))
    denoiser: DenoiserSize | None = None
    second: DenoiserSize | None = None
    vae, encoders = None, []
    for name, entry in sorted(index.items()):
        # [library, class] (a modular index adds where the component was saved: the
        # folder's own subfolder is read); not: [null, null], a list setting (Krea 2's taps)
        if name.startswith("_") or not (isinstance(entry, list) and len(entry) in (2, 3)
                                        and all(isinstance(v, str) for v in entry[:2])):
            continue
        entry = entry[:2]
        if name in DENOISERS or name == SECOND_EXPERT:
            size = _denoiser_size(source, name, entry, lora_rank, lora_scope,
                                  lora_kind if with_lora else None)
            denoiser, second = (denoiser, size) if name == SECOND_EXPERT else (size, second)
        elif name == "vae" or name.startswith("text_encoder"):
            module = _meta_module(source.folder, name, entry)
            size = _size_of(module, ComponentSize(name, _full_config(module), 0))
            _layer_sizes(module, size)
            if name == "vae":
                vae = size
            else:
                encoders.append(size)
    if denoiser is None:
        raise UnknownModel(f"{index_path} names no unet or transformer")
    sizes = ModelSizes(source.family, denoiser, vae, encoders, second)
    if source.file is not None:
        _sizes_from_header(sizes, source.file)
    return sizes


def _config(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name / "config.json"
    if not path.is_file():
        raise UnknownModel(f"no {name}/config.json in {folder}")
    return json.loads(path.read_text(encoding="utf-8"))


def _full_config(module: Any) -> dict[str, Any]:
    """The module's config with the class defaults config.json leaves out (diffusers'
    AutoencoderKL force_upcast, a UNet's transformer_layers_per_block)."""
    config = module.config
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _meta_module(folder: Path, name: str, entry: list[str]) -> Any:
    """The component built from its config.json on the meta device (no memory)."""
    from core.models.empty import empty_weights

    library, class_name = entry[0], entry[1]
    config = _config(folder, name)
    if library not in ("diffusers", "transformers"):
        raise UnknownModel(f"{name}: {library}.{class_name} is not a diffusers or "
                           "transformers model")
    cls = getattr(importlib.import_module(library), class_name, None)
    if cls is None:
        raise UnknownModel(f"{name}: {library} has no class {class_name}")
    with empty_weights(include_buffers=True):
        if library == "diffusers":
            return cls.from_config(config)
        module = cls(cls.config_class.from_dict(config))
    # from_pretrained ties T5's encoder.embed_tokens to `shared`; count it once, as loaded.
    if hasattr(module, "tie_weights"):
        module.tie_weights()
    return module


def _size_of(module: Any, size: Any) -> Any:
    """Adds `module`'s floating-point and integer tensors to `size` (a ComponentSize or
    a BlockSize) and returns it."""
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.is_floating_point():
            size.floats += tensor.numel()
        else:
            size.other_bytes += tensor.numel() * tensor.element_size()
    return size


def _denoiser_size(source: ConfigSource, name: str, entry: list[str], lora_rank: int,
                   lora_scope: str, lora_kind: str | None) -> DenoiserSize:
    """lora_kind: the adapter to count, None for a full fine-tune."""
    module = _meta_module(source.folder, name, entry)
    size = _size_of(module, DenoiserSize(name, _full_config(module), 0))
    assert isinstance(size, DenoiserSize)
    per_block = _count_quantizable(module, size)
    size.quantizable_in_a_block = max(per_block.values(), default=0)
    size.blocks = [_block_size(block) for block in _repeated_blocks(module, source.family)]
    if lora_kind is not None:
        size.lora = lora_parameters(module, source.family, lora_rank, lora_scope, lora_kind)
    return size


def _layer_sizes(module: Any, size: ComponentSize) -> None:
    from core.models.block_swap import repeated_layers

    layers = [sum(p.numel() for p in layer.parameters()) for layer in repeated_layers(module)]
    size.layer_floats, size.largest_layer = sum(layers), max(layers, default=0)


def _repeated_blocks(module: Any, family: str) -> list[Any]:
    from core.models.registry import family_or_defaults

    names = family_or_defaults(family).block_lists
    return [block for name in names for block in getattr(module, name, [])]


def _block_size(block: Any) -> BlockSize:
    size = _size_of(block, BlockSize())
    _count_quantizable(block, size)
    return size


def _count_quantizable(module: Any, size: Any) -> dict[str, int]:
    """Adds `module`'s quantizable weights, their rows and nf4 blocks to `size`; returns
    the quantizable weights per block (the stack's unit, _block_of)."""
    from core.models.quantize import quantizable

    per_block: dict[str, int] = {}
    for module_name, sub in module.named_modules():
        weight = getattr(sub, "weight", None)
        if weight is None or not quantizable(module_name, sub):
            continue
        size.quantizable += weight.numel()
        size.quantizable_rows += weight.shape[0]
        size.quantizable_blocks += math.ceil(weight.numel() / NF4_BLOCK)
        block = _block_of(module_name)
        per_block[block] = per_block.get(block, 0) + weight.numel()
    return per_block


def _block_of(module_name: str) -> str:
    """The block a layer is in: its name up to the first index (`transformer_blocks.3`,
    `down_blocks.1`); a layer outside the stacks is a block of its own."""
    parts = module_name.split(".")
    index = next((i for i, part in enumerate(parts) if part.isdigit()), len(parts) - 1)
    return ".".join(parts[:index + 1])


def lora_parameters(denoiser: Any, family: str, rank: int, scope: str,
                    kind: str = "lora") -> int:
    """What peft adds to `denoiser` (meta or real) for the family's targets: the
    train.lora_kind adapter, built by peft itself with the run's defaults
    (adapters.adapter_config), so each kind counts as trained: LoRA r (in + out) per
    layer; DoRA that plus one magnitude per output row; LoKr its Kronecker factors (one
    full, the other full or rank-r, as peft factorises the layer); LoHa twice LoRA's."""
    from core.models.adapters import adapter_config
    from core.models.empty import empty_weights
    from core.models.registry import get_family

    targets = get_family(family).lora_target_modules(scope)
    denoiser.requires_grad_(False)
    with empty_weights():  # DoRA's magnitudes are norms of meta weights: meta too
        denoiser.add_adapter(adapter_config(kind, rank, rank, targets))
    return sum(p.numel() for p in denoiser.parameters() if p.requires_grad)


# ---------------------------------------------------------------- single files


def safetensors_shapes(path: Path) -> dict[str, tuple[str, list[int]]]:
    """dtype and shape of every tensor of a .safetensors file, from its JSON header."""
    from core.models.loading import safetensors_header

    return {k: (v["dtype"], list(v["shape"])) for k, v in safetensors_header(str(path)).items()}


def _sizes_from_header(sizes: ModelSizes, path: Path) -> None:
    """Frozen sizes from the file's tensors: its denoiser, and its VAE and text encoders
    when it bundles them (else the architecture's, which the loader fetches apart).
    The quantizable share and the LoRA come from the architecture, scaled to the file."""
    from core.models.comfy_file import is_extra

    groups = {"denoiser": [0, 0], "vae": [0, 0], "text": [0, 0]}
    for key, (dtype, shape) in safetensors_shapes(path).items():
        if is_extra(key):  # a scaled fp8 file's scales: dropped at load
            continue
        group = ("vae" if key.startswith(VAE_PREFIXES)
                 else "text" if key.startswith(TEXT_PREFIXES) else "denoiser")
        count = math.prod(shape)
        if dtype in _INT_BYTES:
            groups[group][1] += count * _INT_BYTES[dtype]
        else:
            groups[group][0] += count
    d = sizes.denoiser
    if d.floats and groups["denoiser"][0]:
        scale = groups["denoiser"][0] / d.floats
        d.quantizable = min(int(d.quantizable * scale), groups["denoiser"][0])
        d.quantizable_rows = int(d.quantizable_rows * scale)
        d.quantizable_blocks = int(d.quantizable_blocks * scale)
        d.quantizable_in_a_block = int(d.quantizable_in_a_block * scale)
    d.floats, d.other_bytes = groups["denoiser"]
    if sizes.vae is not None and groups["vae"][0]:
        sizes.vae.floats, sizes.vae.other_bytes = groups["vae"]
    arch_text = sum(e.floats for e in sizes.text_encoders)
    if arch_text and groups["text"][0]:
        total = groups["text"][0]
        for encoder in sizes.text_encoders:  # the file's tensors, shared in proportion
            encoder.floats = round(total * encoder.floats / arch_text)
            encoder.other_bytes = 0
        sizes.text_encoders[0].other_bytes = groups["text"][1]

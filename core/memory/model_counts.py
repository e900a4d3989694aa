"""The sizes a memory estimate needs, read from a model's configs without loading weights.

Where the configs come from (`config_source`, by the kind core/models/source.py gives
model.path): a local diffusers folder; `random:<family>` the full-size configs in
core/models/families/<family>/full_size/; `tiny:<family>` the workspace's built tiny model,
or a throwaway build in a temporary folder (a check writes nothing to the workspace); a
hub id the HF cache only (a check downloads nothing); a single-file
.safetensors the tensor shapes in its header, with the architecture (LoRA layers,
activations, and the parts the file lacks) from the full-size configs of its family.

Each component is instantiated on the meta device from its config.json (accelerate's
init_empty_weights, buffers included: SD3's positional table is one), so the counts are
the model's own: parameters and buffers, the adapter's parameters as peft adds them (of
train.lora_kind: LoRA, DoRA, LoKr or LoHa), and the
weights `core.models.quantize.quantizable` picks.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import json
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DENOISERS = ("unet", "transformer")
SECOND_EXPERT = "transformer_2"  # a two-expert model's low-noise denoiser (Wan 2.2 A14B)
NF4_BLOCK = 64  # weights per fp32 absmax in bitsandbytes' nf4
# Original-format (A1111/ComfyUI) key prefixes of the parts a single file may bundle;
# every other tensor belongs to the denoiser.
VAE_PREFIXES = ("first_stage_model.", "vae.")
TEXT_PREFIXES = ("cond_stage_model.", "conditioner.", "text_encoders.", "text_encoder.")
_INT_BYTES = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


class UnknownModel(Exception):
    """The configs cannot be read without a download or a build; the message says why."""


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


@dataclass
class ConfigSource:
    family: str
    folder: Path  # diffusers layout: model_index.json and <component>/config.json
    file: Path | None = None  # a single-file checkpoint: frozen sizes from its header


# ---------------------------------------------------------------- where the configs are


@contextlib.contextmanager
def config_source(path: str, family: str, workspace: Path) -> Iterator[ConfigSource]:
    """The folder of configs for model.path (resolved); raises UnknownModel."""
    from core.models.full_size import family_of, full_size_dir
    from core.models.source import model_source
    from core.models.tiny import tiny_family

    source, p = model_source(path), Path(path).expanduser()
    if source.kind == "tiny":
        with _tiny_folder(source.name, workspace) as folder:
            yield ConfigSource(tiny_family(source.name) or source.name, folder)
    elif source.kind == "random":
        yield ConfigSource(family_of(source.name), _config_folder(full_size_dir(source.name),
                                                      f"{path}: no full-size"))
    elif source.kind == "folder":
        yield ConfigSource(family, _config_folder(p, f"{path}: no"))
    elif source.kind == "file":
        from core.models.loading import detect_checkpoint_family, safetensors_keys

        found = detect_checkpoint_family(safetensors_keys(str(p))) or family
        arch = _config_folder(full_size_dir(found), f"{path} is a single file and there "
                              f"are no full-size {found} configs for its architecture:")
        yield ConfigSource(found, arch, file=p)
    else:
        from core.models.source import ModelLoadError, classify_source

        try:
            classify_source(path)  # a missing folder or file is not a hub id
        except ModelLoadError as exc:
            raise UnknownModel(f"{path} {exc.problem.message}") from None
        yield ConfigSource(family, _hub_folder(path))


def _config_folder(folder: Path, missing: str) -> Path:
    if not (folder / "model_index.json").is_file():
        raise UnknownModel(f"{missing} model_index.json in {folder}")
    return folder


def _hub_folder(repo_id: str) -> Path:
    """The cached snapshot of a hub model (its configs), without any download."""
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo_id, "model_index.json")
    except Exception:  # noqa: BLE001 - an odd id or cache is simply not cached
        cached = None
    if not isinstance(cached, str):
        raise UnknownModel(f"hub model {repo_id} is not in the HF cache, and a check "
                           "downloads nothing")
    return Path(cached).parent


@contextlib.contextmanager
def _tiny_folder(name: str, workspace: Path) -> Iterator[Path]:
    """The workspace's built tiny model, else a build in a temporary folder, deleted
    afterwards: the check leaves the workspace as it was."""
    from core.models.tiny import TINY_SEED, tiny_builder, tiny_dir, tiny_is_built

    if tiny_is_built(name, workspace):
        yield tiny_dir(name, workspace)
        return
    import torch

    with tempfile.TemporaryDirectory(prefix=f"memory-estimate-tiny-{name}-") as tmp:
        with torch.random.fork_rng(devices=[]):  # the build seeds torch; keep the caller's
            tiny_builder(name)(Path(tmp), TINY_SEED)
        yield Path(tmp)


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
    paths = [source.folder / "model_index.json", *sorted(source.folder.glob("*/config.json"))]
    if source.file is not None:
        paths.append(source.file)
    stats = [(str(path), path.stat()) for path in paths if path.is_file()]
    return tuple((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats)


@functools.lru_cache(maxsize=16)
def _read_sizes(family: str, folder: Path, file: Path | None, stamp: tuple[Any, ...],
                lora_rank: int, lora_scope: str, with_lora: bool,
                lora_kind: str) -> ModelSizes:
    source = ConfigSource(family, folder, file)
    index = json.loads((source.folder / "model_index.json").read_text(encoding="utf-8"))
    denoiser: DenoiserSize | None = None
    second: DenoiserSize | None = None
    vae, encoders = None, []
    for name, entry in sorted(index.items()):
        if name.startswith("_") or not (isinstance(entry, list) and len(entry) == 2
                                        and all(isinstance(v, str) for v in entry)):
            continue  # not [library, class]: [null, null], a list setting (Krea 2's taps)
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
        raise UnknownModel(f"{source.folder}/model_index.json names no unet or transformer")
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

"""Placing the denoiser in the trainer: streamed from its source a layer at a time
(core/models/stream_load.py) or moved from host memory whole, with model.blocks_to_swap's
swapped blocks on the host either way; and the swappers once the adapter is on
(core/models/block_swap.py does the work)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.config import Config
from core.models.blocks import denoiser_stacks
from core.train.errors import TrainingError

if TYPE_CHECKING:
    from core.models.base import Components, ModelFamily


def swapped_stacks(family: ModelFamily, denoiser: Any, cfg: Config) -> list[list[Any]]:
    """The block stacks model.blocks_to_swap streams from host memory (none when 0)."""
    if not cfg.model.blocks_to_swap:
        return []
    stacks = denoiser_stacks(family, denoiser)
    if not stacks:  # the check refuses this first; a clear error all the same
        raise TrainingError(f"model.blocks_to_swap: {family.name} declares no blocks to "
                            "swap; set model.blocks_to_swap = 0")
    return stacks


def parked(family: ModelFamily, denoiser: Any, cfg: Config) -> list[Any]:
    """The modules model.offload_inactive_expert keeps in host memory to start with
    (a family with experts' idle ones)."""
    from core.config.block_swap import parks_inactive_expert

    if family.experts is None or not parks_inactive_expert(cfg):
        return []
    return family.experts.parked(denoiser)


def place_with_swap(family: ModelFamily, denoiser: Any, cfg: Config, device: Any) -> bool:
    """The denoiser onto `device` (quantized as asked) but for its swapped blocks and a
    parked expert, which stay on the CPU; False when nothing swaps or parks (the caller
    places it as usual)."""
    from core.models.block_swap import place_denoiser

    stacks, waiting = swapped_stacks(family, denoiser, cfg), parked(family, denoiser, cfg)
    if stacks or waiting:
        place_denoiser(denoiser, stacks, cfg.model.blocks_to_swap, cfg.model.quantize, device,
                       waiting)
    return bool(stacks or waiting)


def loading_line(c: Components, fallback: str | None) -> str:
    """The log's word on how the denoiser reaches its device."""
    if c.denoiser_stream is not None:
        return (f"denoiser: streamed from {c.denoiser_stream.source} to its device a layer "
                "at a time (host memory holds one layer and the swapped blocks)")
    why = fallback or "its loader gave it whole"
    return f"denoiser: loaded whole into host memory before it is placed ({why})"


def place_for_training(family: ModelFamily, c: Components, cfg: Config, device: Any) -> None:
    """The denoiser onto `device`, quantized as asked, its swapped blocks (and a parked
    expert) on the host: filled there from its source when it streams, else moved from
    the CPU where it was loaded whole."""
    from core.models.quantize import quantize_frozen

    if c.denoiser_stream is None:
        if not place_with_swap(family, c.denoiser, cfg, device):
            quantize_frozen(c.denoiser, cfg.model.quantize, device)
        return
    from core.models.stream_load import place_streamed

    if parked(family, c.denoiser, cfg):  # random: builds one expert; a clear error all the same
        raise TrainingError("model.offload_inactive_expert: a streamed denoiser has no "
                            "second expert to park")
    count = cfg.model.blocks_to_swap
    swapped = [block for blocks in swapped_stacks(family, c.denoiser, cfg)
               for block in blocks[:count]]
    place_streamed(c.denoiser, c.denoiser_stream, swapped, cfg.model.quantize, device)
    c.denoiser_stream = None


def start_swapping(family: ModelFamily, denoiser: Any, cfg: Config, device: Any,
                   reporter: Any) -> list[Any]:
    """The swappers over the placed denoiser, once its adapter is added (the adapter's
    weights in the swapped blocks go to the device with the rest of what trains); DDP
    is told to leave the host-held tensors alone."""
    from core.models.block_swap import held_ids, install

    stacks = swapped_stacks(family, denoiser, cfg)
    try:
        swappers = install(stacks, cfg.model.blocks_to_swap, device) if stacks else []
    except ValueError as exc:
        raise TrainingError(str(exc)) from None
    parking = bool(parked(family, denoiser, cfg))
    if parking and family.experts is not None:
        family.experts.start_parking(denoiser, device, held_ids(swappers))
        reporter.say("model.offload_inactive_expert: the expert a step does not use waits "
                     "in host memory")
    if swappers or parking:  # DDP syncs what trains; the frozen rest may be on the host
        denoiser._ddp_params_and_buffers_to_ignore = frozen_names(denoiser)
    if not swappers:
        return []
    held = sum(t.host.numel() * t.host.element_size() for s in swappers
               for frozen in s.frozen.values() for t in frozen)
    reporter.event("block_swap", swapped=[s.count for s in swappers],
                   blocks=[len(s.blocks) for s in swappers], host_bytes=held)
    blocks = ", ".join(f"{s.count} of {len(s.blocks)}" for s in swappers)
    reporter.say(f"model.blocks_to_swap: {blocks} blocks stream from host memory "
                 f"({held / 1024 ** 3:.2f} GiB held there)")
    return swappers


def frozen_names(root: Any) -> list[str]:
    """Every frozen parameter and buffer of `root`, by name: the same on every process
    (loaded alike), so DDP need not check their devices or broadcast them."""
    names = [n for n, p in root.named_parameters(remove_duplicate=False) if not p.requires_grad]
    return names + [n for n, _ in root.named_buffers(remove_duplicate=False)]

"""model.blocks_to_swap in the memory estimate: the swapped blocks leave the per-GPU figure
for pinned host memory, two blocks' worth of buffers stay in flight on the GPU, and when a
config does not fit its card the smallest count that does is named (core/check.py and the
Training tab show it; core/memory/estimate.py calls these).

What swaps is what core/models/block_swap.py swaps: the frozen tensors of the first N
blocks of each block stack (one stack per transformer: a two-expert Wan 2.2 swaps N of
each). On the GPU stay the block running and the one being copied, and after a backward
one block per stack (the last recomputed one) until the next pass.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from core.memory.host import per_machine
from core.memory.report import GIB, MemoryPart
from core.models.quantize import frozen_bytes
from core.problems import Problem, error, warning

if TYPE_CHECKING:
    from core.config import Config
    from core.memory.model_counts import DenoiserSize
    from core.memory.report import MemoryEstimate

KEY = "model.blocks_to_swap"


def swapped_bytes(cfg: Config, experts: list[DenoiserSize], wbytes: int) -> tuple[int, int]:
    """(frozen bytes held in host memory, per process; the GPU buffers they need in
    flight): the swapped blocks (model.blocks_to_swap) and, for a two-expert model with
    model.offload_inactive_expert, one expert's unswapped rest as well (the larger
    expert's stays counted on the GPU). (0, 0) when neither applies."""
    from core.config.block_swap import parks_inactive_expert

    count = cfg.model.blocks_to_swap if cfg.train.method == "lora" else 0
    held, largest, rests = 0, 0, []
    for expert in experts:
        sizes = [frozen_bytes(block, cfg.model.quantize, wbytes)
                 for block in expert.blocks[:count]]
        held += sum(sizes)
        largest = max([largest, *sizes])
        rests.append(frozen_bytes(expert, cfg.model.quantize, wbytes) - sum(sizes))
    if len(experts) > 1 and cfg.train.method == "lora" and parks_inactive_expert(cfg):
        held += sum(rests) - max(rests)
    return held, largest * (1 + len(experts)) if count else 0


def host_parts(cfg: Config, held: int, experts: int = 1) -> list[MemoryPart]:
    """Pinned host memory per machine: each process holds its own copy."""
    from core.config.block_swap import parks_inactive_expert

    if not held:
        return []
    name = ("swapped blocks and the idle expert" if experts > 1 and parks_inactive_expert(cfg)
            else "swapped blocks")
    return per_machine(cfg, [MemoryPart(name, held)])


def machine_ram_bytes() -> int | None:
    """This machine's physical memory, or None where it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def swap_problems(cfg: Config, estimate: MemoryEstimate | None) -> list[Problem]:
    """At --stage check, with the model's sizes: more blocks than a stack has, and host
    RAM too small for the pinned copies (a warning when planning for another machine
    with launch.gpu_memory_gib)."""
    count = cfg.model.blocks_to_swap
    if not count or estimate is None or estimate.max_blocks is None:
        return []
    if count > estimate.max_blocks:
        return [error(KEY, f"{count}: {cfg.model.path} has {estimate.max_blocks} blocks to "
                           f"swap (per transformer); set at most {estimate.max_blocks}")]
    held = sum(p.bytes for p in estimate.host)
    ram = machine_ram_bytes()
    if ram is None or held <= ram:
        return []
    text = (f"{count}: the swapped blocks need {held / GIB:.1f} GiB of pinned host RAM and "
            f"this machine has {ram / GIB:.1f} GiB; swap fewer blocks or quantize the base "
            "(model.quantize)")
    return [warning(KEY, text) if cfg.launch.gpu_memory_gib else error(KEY, text)]

"""Host memory per machine in the memory estimate: the peak over the run's phases, not
only the pinned copies of swapped blocks.

- Loading: every part is read into host memory in the dtype it runs in before anything
  goes to the GPU (core/train/setup.py load_and_place), so a 20 B base quantized to int8
  on the GPU still passes through RAM in bf16: on an H200 machine the trainer held
  55.3 GiB of RAM after loading random:qwen_image (53.7 GiB of weights in bf16 and the
  process), 27 GiB while training (docs/memory.md).
- Training: the text encoders and the VAE wait on the CPU, the swapped blocks (and an
  idle expert) are pinned there.

Each process of a machine holds its own copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.memory_report import GIB, MemoryPart
from core.models.quantize import frozen_bytes
from core.problems import Problem, warning

if TYPE_CHECKING:
    from core.config import Config
    from core.memory_report import MemoryEstimate
    from core.models.memory_model import ModelSizes

# The trainer process itself: the interpreter, torch and its CUDA libraries, the data
# loader. Measured: 1.6 GiB beside Qwen-Image's weights on an H200 machine (2026-11-28).
PROCESS_HOST_BYTES = 3 * GIB // 2


def host_encoders(sizes: ModelSizes, wbytes: int, vae: MemoryPart) -> list[MemoryPart]:
    """The text encoders whole (model.stream_text_encoders keeps them in host memory and
    copies a layer at a time) and the VAE, as host memory holds them."""
    text = sum(e.floats * wbytes + e.other_bytes for e in sizes.text_encoders)
    return [MemoryPart("text encoders", text), vae]


def loading_parts(cfg: Config, sizes: ModelSizes, wbytes: int,
                  encoders: list[MemoryPart]) -> list[MemoryPart]:
    """Host memory once every part is loaded, per machine: the denoiser (and a second
    expert) at the weights' dtype, quantized only on its way to the GPU, the text
    encoders and VAE (host_encoders), and the process."""
    denoisers = [sizes.denoiser] + ([sizes.second_expert] if sizes.second_expert else [])
    weights = sum(frozen_bytes(d, "none", wbytes) for d in denoisers)
    parts = [MemoryPart("denoiser as loaded", weights), *encoders,
             MemoryPart("process", PROCESS_HOST_BYTES, exact=False)]
    return _per_machine(cfg, parts)


def training_host_parts(cfg: Config, encoders: list[MemoryPart],
                        pinned: list[MemoryPart]) -> list[MemoryPart]:
    """Host memory while training, per machine: the encoders waiting on the CPU, the
    pinned swapped blocks (already per machine) and the process."""
    own = [*encoders, MemoryPart("process", PROCESS_HOST_BYTES, exact=False)]
    return [*_per_machine(cfg, own), *pinned]


def _per_machine(cfg: Config, parts: list[MemoryPart]) -> list[MemoryPart]:
    processes = cfg.launch.num_processes
    if processes <= 1:
        return parts
    return [MemoryPart(f"{p.name} x {processes} processes", p.bytes * processes, p.exact)
            for p in parts]


def host_memory_problems(cfg: Config, estimate: MemoryEstimate | None,
                         ram: int | None) -> list[Problem]:
    """A warning when the host memory's peak is more than this machine's RAM (`ram`), or
    than launch.host_memory_gib when that plans another machine."""
    if estimate is None or not estimate.host_loading:
        return []
    planned = cfg.launch.host_memory_gib
    limit = int(planned * GIB) if planned else ram
    peak = estimate.host_peak_bytes
    if limit is None or peak <= limit:
        return []
    whose = "launch.host_memory_gib" if planned else "this machine's RAM"
    lower = (LOADING_HINT if estimate.host_peak_phase == "loading" else
             "swap fewer blocks (model.blocks_to_swap) or run fewer processes")
    return [warning("memory", f"host memory: the run needs about {peak / GIB:.1f} GiB of "
                              f"RAM at its peak ({estimate.host_peak_phase}) and {whose} "
                              f"is {limit / GIB:.1f} GiB: the system may swap, or end the "
                              f"trainer as out of memory; {lower}")]


LOADING_HINT = ("every part is read into RAM in the training dtype before the GPU gets it "
                "(a quantized base too): a machine with more RAM, or swap space, carries it")

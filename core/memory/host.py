"""Host memory per machine in the memory estimate: the peak over the run's phases, not
only the pinned copies of swapped blocks.

- Loading: the text encoders and VAE are read into host memory in the dtype they run in
  before anything goes to the GPU (core/train/setup.py load_and_place). A streamed
  denoiser (config/streaming.py: LoRA on random: models and diffusers folders) comes to
  the GPU a layer at a time, so host memory holds only its swapped blocks and one layer
  in flight; otherwise it is read whole too, so a 20 B base quantized to int8 on the
  GPU passes through RAM in bf16: on an H200 machine the trainer held 55.3 GiB of RAM
  after loading random:qwen_image that way (53.7 GiB of weights in bf16 and the
  process), 27 GiB while training (docs/memory.md).
- Training: the text encoders and the VAE wait on the CPU, the swapped blocks (and an
  idle expert) are pinned there.

Each process of a machine holds its own copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.config.streaming import stream_fallback
from core.memory.report import GIB, MemoryPart
from core.models.quantize import frozen_bytes
from core.problems import Problem, warning

if TYPE_CHECKING:
    from core.config import Config
    from core.memory.model_counts import ModelSizes
    from core.memory.report import MemoryEstimate

# The trainer process itself: the interpreter, torch and its CUDA libraries, the data
# loader. Measured: 1.6 GiB beside Qwen-Image's weights on an H200 machine (2026-11-28).
PROCESS_HOST_BYTES = 3 * GIB // 2


def host_encoders(sizes: ModelSizes, wbytes: int, vae: MemoryPart) -> list[MemoryPart]:
    """The text encoders whole (model.stream_text_encoders keeps them in host memory and
    copies a layer at a time) and the VAE, as host memory holds them."""
    text = sum(e.floats * wbytes + e.other_bytes for e in sizes.text_encoders)
    return [MemoryPart("text encoders", text), vae]


def loading_parts(cfg: Config, sizes: ModelSizes, wbytes: int, encoders: list[MemoryPart],
                  pinned: list[MemoryPart]) -> list[MemoryPart]:
    """Host memory once every part is loaded, per machine: the text encoders and VAE
    (host_encoders), the process, and the denoiser: loaded whole (and a second expert)
    at the weights' dtype, quantized only on its way to the GPU; or, streamed, its
    swapped blocks (`pinned`, already per machine) and one layer in flight, counted as
    its largest block (a layer and its quantization's temporaries fit in it)."""
    process = MemoryPart("process", PROCESS_HOST_BYTES, exact=False)
    if stream_fallback(cfg) is None:
        block = max((frozen_bytes(b, "none", wbytes) for b in sizes.denoiser.blocks),
                    default=frozen_bytes(sizes.denoiser, "none", wbytes))
        own = [*encoders, MemoryPart("a layer in flight", block, exact=False), process]
        return [*per_machine(cfg, own), *pinned]
    denoisers = [sizes.denoiser] + ([sizes.second_expert] if sizes.second_expert else [])
    weights = sum(frozen_bytes(d, "none", wbytes) for d in denoisers)
    return per_machine(cfg, [MemoryPart("denoiser as loaded", weights), *encoders, process])


def training_host_parts(cfg: Config, encoders: list[MemoryPart],
                        pinned: list[MemoryPart]) -> list[MemoryPart]:
    """Host memory while training, per machine: the encoders waiting on the CPU, the
    pinned swapped blocks (already per machine) and the process."""
    own = [*encoders, MemoryPart("process", PROCESS_HOST_BYTES, exact=False)]
    return [*per_machine(cfg, own), *pinned]


def per_machine(cfg: Config, parts: list[MemoryPart]) -> list[MemoryPart]:
    """`parts` of one process as a machine holds them: each process its own copy."""
    processes = cfg.launch.num_processes
    if processes <= 1:
        return parts
    return [MemoryPart(f"{p.name} x {processes} processes", p.bytes * processes, p.exact)
            for p in parts]


def host_limit(cfg: Config, ram: int | None) -> int | None:
    """The RAM a machine of the run has: launch.host_memory_gib's when it plans another
    machine, else `ram` (this machine's, or None where it cannot be read)."""
    planned = cfg.launch.host_memory_gib
    return int(planned * GIB) if planned else ram


def host_memory_problems(cfg: Config, estimate: MemoryEstimate | None,
                         ram: int | None) -> list[Problem]:
    """A warning when the host memory's peak is more than this machine's RAM (`ram`), or
    than launch.host_memory_gib when that plans another machine."""
    if estimate is None or not estimate.host_loading:
        return []
    planned = cfg.launch.host_memory_gib
    limit = host_limit(cfg, ram)
    peak = estimate.host_peak_bytes
    if limit is None or peak <= limit:
        return []
    whose = "launch.host_memory_gib" if planned else "this machine's RAM"
    streamed = stream_fallback(cfg) is None
    lower = ((STREAMED_HINT if streamed else LOADING_HINT)
             if estimate.host_peak_phase == "loading" else
             "swap fewer blocks (model.blocks_to_swap) or run fewer processes")
    return [warning("memory", f"host memory: the run needs about {peak / GIB:.1f} GiB of "
                              f"RAM at its peak ({estimate.host_peak_phase}) and {whose} "
                              f"is {limit / GIB:.1f} GiB: the system may swap, or end the "
                              f"trainer as out of memory; {lower}")]


STREAMED_HINT = ("the text encoders and VAE are read whole into RAM (the denoiser streams "
                 "a layer at a time): a machine with more RAM, or swap space, carries them")
LOADING_HINT = ("every part is read into RAM in the training dtype before the GPU gets it "
                "(a quantized base too): a machine with more RAM, or swap space, carries it")

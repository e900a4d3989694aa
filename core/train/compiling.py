"""train.compile = "blocks": torch.compile of the denoiser's repeated blocks, and what the
log says about it (core/config/compiling.py refuses what it cannot combine with).

Why blocks and not the whole denoiser: the blocks of a stack share one class, so with
torch's inlined nn.Modules one compiled graph serves every block of the stack (a few
graphs, compiled once) where the whole model would be one large graph, slow to compile
and broken by the families' Python around the blocks. `dynamic=True` traces sizes as
symbols from the first compile, so a new aspect bucket (another token count) or frame
count runs the same code instead of compiling again. Compiled in place (Module.compile),
so parameter names, LoRA saving and gradient checkpointing (which calls the block) see
the same modules.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.models.base import ModelFamily

# The backend torch.compile uses: inductor (generated kernels) unless this says another.
# "aot_eager" traces and runs the same forward/backward graphs without generating code:
# what the CPU tests use, as inductor's C++ build takes minutes on a small machine.
BACKEND_ENV = "TRAIN_COMPILE_BACKEND"


def compile_blocks(family: ModelFamily, denoiser: Any, mode: str, say: Any) -> CompileWatch | None:
    """Compile every block of the denoiser's stacks in place when `mode` is "blocks";
    the watch that reports the compiles, or None when nothing is compiled."""
    if mode == "off":
        return None
    from core.models.blocks import denoiser_stacks

    stacks = denoiser_stacks(family, denoiser)
    if not stacks:  # the check refuses this first; a clear error all the same
        from core.train.errors import TrainingError

        raise TrainingError(f"train.compile = \"{mode}\": {family.name} declares no repeated "
                            "blocks to compile; set train.compile = \"off\"")
    backend = os.environ.get(BACKEND_ENV) or "inductor"
    for stack in stacks:
        for block in stack:
            block.compile(dynamic=True, backend=backend)
    count = sum(len(stack) for stack in stacks)
    say(f"train.compile = blocks: {count} blocks ({', '.join(family.block_lists)}) compile "
        f"on first use, backend {backend}, dynamic shapes")
    return CompileWatch()


def eager(watch: CompileWatch | None) -> Any:
    """Eval and validation run the blocks uncompiled: their no-grad forwards would each
    compile graphs of their own (minutes of compiling for rounds that run rarely)."""
    if watch is None:
        return contextlib.nullcontext()
    import torch

    return torch.compiler.set_stance("force_eager")


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _compile_seconds() -> float:
    """Seconds torch spent compiling in this process so far (dynamo's own timer of each
    compile, which holds the backend's code generation)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(compilation_time_metrics.get("_compile.compile_inner", []))


class CompileWatch:
    """The graphs compiled so far and the time it took: the first step's compile goes
    into the log and a `compile` event; a later compile (a shape the dynamic graph does
    not cover) too, at the next logged step."""

    def __init__(self) -> None:
        self.graphs = _graphs()
        self.seconds = _compile_seconds()

    def news(self, step: int, reporter: Any, first_step_s: float | None = None) -> float:
        """Report the compiles since the last call; returns their seconds, which the
        caller keeps out of the step times (and so out of the ETA)."""
        graphs, seconds = _graphs(), _compile_seconds()
        new, spent = graphs - self.graphs, seconds - self.seconds
        self.graphs, self.seconds = graphs, seconds
        if not new:
            return 0.0
        reporter.event("compile", step=step, graphs=graphs, new_graphs=new,
                       seconds=round(spent, 3), first_step_s=first_step_s)
        took = f", the first step {first_step_s:.1f} s" if first_step_s is not None else ""
        reporter.say(f"train.compile: {new} graph(s) compiled at step {step} in {spent:.1f} s"
                     f"{took}; {graphs} in all")
        return spent


def attention_line(denoiser: Any, dtype: Any, device: Any) -> str | None:
    """Which attention kernel the denoiser's attention gets on a CUDA device: diffusers'
    dispatch backend and, for its native backend, the kernel torch's
    scaled_dot_product_attention picks for this dtype and head size (flash, then
    memory-efficient; cuDNN is off, core/models/modules.py avoid_cudnn_attention). None
    on other devices, whose attention is left as it is."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    dtype = dtype or torch.float32  # no mixed precision
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    backend = str(_AttentionBackendRegistry.get_active_backend()[0].value)
    head = getattr(getattr(denoiser, "config", None), "attention_head_dim", None)
    head = head if isinstance(head, int) else 64
    kernel = "unknown"
    try:
        q = torch.zeros(1, 8, 256, head, device=device, dtype=dtype)
        params = torch.backends.cuda.SDPAParams(q, q, q, None, 0.0, False, False)
        if torch.backends.cuda.flash_sdp_enabled() and \
                torch.backends.cuda.can_use_flash_attention(params, False):
            kernel = "flash"
        elif torch.backends.cuda.mem_efficient_sdp_enabled() and \
                torch.backends.cuda.can_use_efficient_attention(params, False):
            kernel = "memory-efficient"
        else:
            kernel = "math (no fused kernel applies)"
    except (AttributeError, RuntimeError, TypeError):
        pass  # a torch without these probes: the backend alone is logged
    return (f"attention: diffusers backend {backend}; torch SDPA picks {kernel} for "
            f"{str(dtype).replace('torch.', '')} heads of {head} (cuDNN off)")

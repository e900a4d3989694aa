"""Give a meta-device module real storage on a device, in a dtype, filled with seeded
random weights that keep activations finite in fp32, bf16 and fp16.

Init, per parameter (variance-preserving, so depth does not blow activations up):
- weights of 2 or more dimensions (linear, conv): uniform with variance 1/fan_in, where
  fan_in is the product of all dimensions but the first (LeCun scaling);
- embedding tables: uniform with variance 1 (what a prenorm encoder expects);
- 1-d `weight`s (layer/group/RMS norm scales): 1; biases and other 1-d or scalar
  parameters: 0.
Uniform, not normal: bounded values and a faster generator, with the same variance.

Determinism and speed: the random values are drawn on the CPU by chunks of CHUNK
elements, each chunk from its own generator seeded by (seed, component, parameter name,
chunk index), in float32, then cast and copied into the parameter on its device. So a
seed gives the same weights on any device and any number of threads, bf16/fp16 weights
are the float32 ones rounded, chunks run in parallel threads (torch releases the GIL),
and no float32 copy of a whole model ever exists: one chunk per thread.

Parameters shared between modules (T5's tied embedding) stay shared. Modules that
transformers keeps in float32 when loading in fp16 (`_keep_in_fp32_modules`, T5's `wo`)
stay float32 here too, so memory matches a real load.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

CHUNK = 1 << 22  # elements per generator; part of what a seed means: do not change
_SEED_MASK = (1 << 63) - 1


@dataclass
class _Job:
    flat: Any  # a contiguous 1-d view of the parameter
    start: int
    end: int
    bound: float
    seed: int


def chunk_seed(seed: int, prefix: str, name: str, index: int) -> int:
    """A 63-bit generator seed from a stable hash (Python's hash() is salted per run)."""
    digest = hashlib.blake2b(f"{seed}:{prefix}:{name}:{index}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") & _SEED_MASK


def init_rule(module: Any, pname: str, shape: tuple[int, ...]) -> tuple[str, float]:
    """("uniform", bound) or ("const", value) for parameter `pname` of `module`."""
    import torch

    if isinstance(module, torch.nn.Embedding) and pname == "weight":
        return "uniform", math.sqrt(3.0)
    if len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        return "uniform", math.sqrt(3.0 / max(fan_in, 1))
    if len(shape) == 1 and pname == "weight":
        return "const", 1.0
    return "const", 0.0


def _fp32_patterns(module: Any, dtype: Any) -> list[re.Pattern[str]]:
    """Name patterns of the parameters transformers/diffusers keep in float32 at `dtype`."""
    import torch

    names: set[str] = set()
    if dtype == torch.float16:
        names |= set(getattr(module, "_keep_in_fp32_modules", None) or ())
    if dtype in (torch.float16, torch.bfloat16):
        names |= set(getattr(module, "_keep_in_fp32_modules_strict", None) or ())
    return [re.compile(rf"(^|\.){re.escape(n)}(\.|$)") for n in sorted(names)]


def _new_parameters(module: Any, dtype: Any, device: Any) -> list[tuple[str, Any, Any]]:
    """Replace every parameter with empty storage on `device`; returns (name, owner
    module, new parameter) once per distinct parameter."""
    import torch

    keep32 = _fp32_patterns(module, dtype)
    done: dict[int, Any] = {}
    out = []
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for pname, param in list(mod._parameters.items()):
            if param is None:
                continue
            if id(param) in done:  # tied: point at the same new parameter
                mod._parameters[pname] = done[id(param)]
                continue
            full = f"{mod_name}.{pname}" if mod_name else pname
            pdtype = torch.float32 if any(p.search(full) for p in keep32) else dtype
            storage = torch.empty(tuple(param.shape), dtype=pdtype, device=device)
            new = torch.nn.Parameter(storage, requires_grad=False)
            done[id(param)] = mod._parameters[pname] = new
            out.append((full, mod, new))
    return out


def move_buffers(module: Any, dtype: Any, device: Any) -> None:
    """Real buffers to `device`; floating ones in `dtype`, as `module.to(dtype)` does."""
    for mod in module.modules():
        for bname, buf in list(mod._buffers.items()):
            if buf is not None:
                mod._buffers[bname] = buf.to(
                    device=device, dtype=dtype if buf.is_floating_point() else None)


def _run_jobs(jobs: list[_Job], workers: int) -> None:
    import torch

    local = threading.local()

    def run(job: _Job) -> None:
        buf = getattr(local, "buf", None)
        if buf is None:  # one reusable float32 chunk per thread
            buf = local.buf = torch.empty(CHUNK, dtype=torch.float32)
        gen = torch.Generator().manual_seed(job.seed)
        values = buf[: job.end - job.start].uniform_(-job.bound, job.bound, generator=gen)
        job.flat[job.start:job.end].copy_(values)

    if workers <= 1 or len(jobs) <= 1:  # no pool for a tensor of one chunk
        for job in jobs:
            run(job)
        return
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(run, jobs):
            pass


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def materialize(module: Any, dtype: Any, device: Any, seed: int, prefix: str,
                workers: int | None = None) -> Any:
    """Give `module` (parameters on meta) storage on `device` in `dtype` and fill it
    (see the module docstring); `prefix` names the component in the seeds."""
    import torch

    device = torch.device(device)
    params = _new_parameters(module, dtype, device)
    move_buffers(module, dtype, device)
    jobs: list[_Job] = []
    with torch.no_grad():
        for full, mod, param in params:
            jobs += _fill_jobs(param, mod, full, seed, prefix)
        _run_jobs(jobs, default_workers() if workers is None else workers)
    return module


def _fill_jobs(tensor: Any, owner: Any, full: str, seed: int, prefix: str) -> list[_Job]:
    """The chunks that fill `tensor` (parameter `full` of the component, owned by
    `owner`); a constant is filled at once and needs none."""
    kind, value = init_rule(owner, full.rsplit(".", 1)[-1], tuple(tensor.shape))
    if kind == "const":
        tensor.fill_(value)
        return []
    flat = tensor.view(-1)
    return [_Job(flat, start, min(start + CHUNK, flat.numel()), value,
                 chunk_seed(seed, prefix, full, index))
            for index, start in enumerate(range(0, flat.numel(), CHUNK))]


def fill_tensor(tensor: Any, owner: Any, full: str, seed: int, prefix: str,
                workers: int | None = None) -> Any:
    """One parameter filled as `materialize` fills it (the same values for the same
    seed, component `prefix` and name `full` in the component): the streamed load
    (core/models/stream_load.py) fills a layer at a time with it."""
    import torch

    with torch.no_grad():
        _run_jobs(_fill_jobs(tensor, owner, full, seed, prefix),
                  default_workers() if workers is None else workers)
    return tensor


def parameter_dtype(root: Any, full: str, dtype: Any) -> Any:
    """The dtype parameter `full` of component `root` gets at `dtype`: float32 for the
    modules transformers/diffusers keep so, as `materialize` does."""
    import torch

    keep32 = _fp32_patterns(root, dtype)
    return torch.float32 if any(p.search(full) for p in keep32) else dtype

"""Runs a training program with a clock on its optimizer steps (bench/peers.py starts it).

    python bench/steptimer.py OUT.json STEPS WARMUP -- script.py ARGS...
    python bench/steptimer.py OUT.json STEPS WARMUP -- -m package.module ARGS...

The same clock for a diffusers example and for this tool's trainer, so neither side is
timed by its own reporting: a global torch optimizer-step hook stamps every optimizer
step. On CUDA the device is synchronised only at step 1, step WARMUP and step STEPS (the
figures' end points), so the program's own host syncs, or their absence, stay what they
are (STEPTIMER_SYNC_DEBUG=1 has torch name each of them in the log). At step STEPS,
OUT.json gets the stamps and the peak memory so far (CUDA allocated and reserved, or the
process's peak RSS), before the program saves anything.

Both sides run with cuDNN's attention off, as this tool's trainer always does: since torch
2.11 it is the first attention kernel on Hopper, and diffusers' Flux example stopped in
its first backward there (docs/performance.md, 2026-11-27 on an H200).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

# STEPTIMER_SYNC_DEBUG=1: torch warns at every host sync of the steady steps (CUDA), once
# per place in the code (Python's warning filter), so the log names where each side waits.
SYNC_DEBUG = "STEPTIMER_SYNC_DEBUG"


def peak_memory() -> dict[str, int | None]:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {"device_allocated": torch.cuda.max_memory_allocated(),
                "device_reserved": torch.cuda.max_memory_reserved(), "host_rss": None}
    from core.train.memory import host_rss_bytes

    return {"device_allocated": None, "device_reserved": None,
            "host_rss": host_rss_bytes(peak=True)}


def install_clock(out: Path, steps: int, warmup: int) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    stamps: list[float] = []
    synced = {1, warmup, steps}

    debug = os.environ.get(SYNC_DEBUG) == "1" and torch.cuda.is_available()

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        # A program with a second optimizer (none of the timed ones) would count twice.
        if len(stamps) + 1 in synced and torch.cuda.is_available():
            torch.cuda.synchronize()
        stamps.append(time.time())
        if debug and len(stamps) in (warmup, steps):  # the steady steps' syncs, each
            torch.cuda.set_sync_debug_mode("warn" if len(stamps) == warmup else "default")
        if len(stamps) == steps:
            out.write_text(json.dumps({"stamps": stamps, **peak_memory()}), encoding="utf-8")

    register_optimizer_step_post_hook(after_step)


def usable_torchvision() -> None:
    """A CPU-only torch beside the registry's torchvision wheel (built for CUDA torch):
    its C ops cannot load, and the import then stops at registering fake kernels for
    them. The examples use only its Python transforms, so those registrations are
    skipped; with a matching torchvision nothing changes."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        import types

        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        for name in ("_meta_registrations", "_autograd_registrations"):
            sys.modules[f"torchvision.{name}"] = types.ModuleType(f"torchvision.{name}")
        import torchvision  # noqa: F401,F811
    except ImportError:
        pass  # this tool's trainer does not need it


def main() -> None:
    out, steps, warmup, sep, *program = sys.argv[1:]
    if sep != "--" or not program:
        raise SystemExit(__doc__)
    install_clock(Path(out), int(steps), int(warmup))
    usable_torchvision()
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)
    if program[0] == "-m":
        sys.argv = [program[1], *program[2:]]
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = program
        sys.path.insert(0, str(Path(program[0]).resolve().parent))
        runpy.run_path(program[0], run_name="__main__")


if __name__ == "__main__":
    main()

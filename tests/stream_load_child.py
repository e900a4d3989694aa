"""The child process of tests/test_stream_load.py: load a scaled-down random:wan
denoiser one way (`whole`: today's path, built whole on the CPU then quantized;
`streamed`: layer by layer), run it once, and report its host memory.

usage: python tests/stream_load_child.py whole|streamed CONFIG_FOLDER OUT_FILE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCHEME = "int8"


def _status_kib(field: str) -> int:
    """A /proc/self/status figure in KiB (VmRSS: resident now; VmHWM: its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _load(mode: str) -> object:
    import torch

    from core.models.full_size.build import build_module
    from core.models.quantize import quantize_frozen
    from core.models.stream_load import place_streamed, random_denoiser

    if mode == "whole":
        module = build_module("wan", "transformer", torch.float32, "cpu", seed=0)
        quantize_frozen(module, SCHEME, "cpu")
        return module
    module, stream = random_denoiser("wan", "transformer", torch.float32, seed=0)
    place_streamed(module, stream, [], SCHEME, "cpu")
    return module


def main() -> None:
    mode, folder, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    import torch
    import torchao.quantization  # noqa: F401  (in the baseline of both modes alike)
    from diffusers import WanTransformer3DModel  # noqa: F401

    import core.models.full_size.meta as meta

    # The scaled-down configs in place of the shipped ones (the same architecture).
    meta.full_size_dir = lambda name: folder  # type: ignore[assignment]
    torch.set_num_threads(2)
    baseline = _status_kib("VmRSS")
    module = _load(mode)
    loaded_peak = _status_kib("VmHWM")
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, 1, 16, 16, generator=gen)
    text = torch.randn(1, 8, 4096, generator=gen)
    with torch.no_grad():
        output = module(latents, torch.tensor([500]), text, return_dict=False)[0]
    torch.save(output, out.with_suffix(".pt"))
    out.write_text(json.dumps({"baseline_kib": baseline, "loaded_peak_kib": loaded_peak}))


if __name__ == "__main__":
    main()

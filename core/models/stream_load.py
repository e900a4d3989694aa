"""A denoiser loaded straight to where it runs, a layer at a time, so host memory never
holds the whole model in the training dtype (issue 55 item 2; docs/memory.md).

The denoiser is built on the meta device (parameters without storage, in the dtype they
will have; buffers real, on the CPU). `place_streamed` then walks its layers (every
module owning parameters) in order: a `Filler` makes each parameter on the CPU in its
dtype, and the layer goes to its destination at once:
- quantized onto the device, for model.quantize int8/fp8 (quantize.py's per-layer
  quantize_frozen, the one every layer goes through today);
- onto the device in the training dtype when it is not quantized;
- for the blocks model.blocks_to_swap keeps in host memory, back to the CPU (quantized on
  the device first when asked, as block_swap.quantize_on_host does), where the swapper
  pins them (block_swap.install).
So host memory holds one layer in flight plus the swapped blocks. The module that comes
out is the one today's path gives (everything loaded on the CPU, then place_denoiser or
quantize_frozen), weight for weight: tests/test_stream_load.py compares their outputs.

A `random:<family>` denoiser's filler draws its values with fill.py's seeded chunks, the
same values build_random gives. Torch is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# (parameter name in the denoiser, the module that owns it, its meta parameter) -> the
# parameter's values as a CPU tensor in the meta parameter's dtype.
Filler = Callable[[str, Any, Any], Any]


@dataclass
class StreamedDenoiser:
    """Where a meta-device denoiser's weights come from."""

    source: str  # what the log names: random:qwen_image
    fill: Filler


def random_denoiser(family: str, name: str, dtype: Any, seed: int = 0
                    ) -> tuple[Any, StreamedDenoiser]:
    """Component `name` of random:<family> on the meta device, frozen, with the filler
    that draws the values build_module would give it."""
    import torch

    from core.models.full_size.fill import fill_tensor, move_buffers, parameter_dtype
    from core.models.full_size.meta import instantiate

    module = instantiate(family, name, device="cpu")
    move_buffers(module, dtype, "cpu")  # as materialize does: they are small
    meta_parameters(module, lambda full: parameter_dtype(module, full, dtype))
    prefix = f"{family}/{name}"

    def fill(full: str, owner: Any, meta: Any) -> Any:
        values = torch.empty(tuple(meta.shape), dtype=meta.dtype)
        return fill_tensor(values, owner, full, seed, prefix)

    module.requires_grad_(False)
    return module.eval(), StreamedDenoiser(f"random:{family}", fill)


def meta_parameters(module: Any, dtype_of: Callable[[str], Any]) -> None:
    """Every parameter replaced by a meta one in the dtype it will be loaded in
    (`dtype_of` its name: float32 for the modules the library keeps so), so
    `module.dtype` reads right before it is filled (the caches and prompts read it)."""
    import torch

    done: dict[int, Any] = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for pname, param in list(mod._parameters.items()):
            if param is None:
                continue
            if id(param) not in done:
                full = f"{mod_name}.{pname}" if mod_name else pname
                empty = torch.empty(tuple(param.shape), device="meta", dtype=dtype_of(full))
                done[id(param)] = torch.nn.Parameter(empty, requires_grad=False)
            mod._parameters[pname] = done[id(param)]


def place_streamed(module: Any, stream: StreamedDenoiser, swapped: list[Any], scheme: str,
                   device: Any) -> None:
    """Fill the meta-device `module` layer by layer onto `device`, quantized by `scheme`
    ("none", "int8" or "fp8"), but for the `swapped` blocks, which end on the CPU (see
    the module docstring)."""
    import torch

    if scheme not in ("none", "int8", "fp8"):  # stream_fallback keeps nf4 off this path
        raise ValueError(f"the streamed load cannot place model.quantize {scheme!r}")
    host = {id(m) for block in swapped for m in block.modules()}
    # A meta parameter (kept alive, so its id stays its own) -> its first owner and name.
    filled: dict[int, tuple[Any, Any, str]] = {}
    trim = _heap_trimmer()
    for name, owner in module.named_modules():
        where = torch.device("cpu") if id(owner) in host else torch.device(device)
        with torch.no_grad():
            _place_layer(name, owner, stream, scheme, device, where, filled)
        if owner._parameters:
            trim()


def _heap_trimmer() -> Callable[[], None]:
    """glibc's malloc_trim, or nothing off glibc. A layer's float values, freed once it
    is placed, leave holes between what stays on the host (swapped blocks, or every
    quantized layer when the device is the CPU) that glibc keeps resident: the CPU load
    into int8 of tests/test_stream_load.py grew the process by 0.76 GiB without this,
    0.43 with it."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return lambda: None

    def trim_heap() -> None:
        trim(0)

    return trim_heap


def _place_layer(name: str, owner: Any, stream: StreamedDenoiser, scheme: str, device: Any,
                 where: Any, filled: dict[int, tuple[Any, Any, str]]) -> None:
    """One layer's own parameters filled on the CPU and sent to `where` (quantized on
    `device` on the way when it is a quantizable layer), and its own buffers moved."""
    import torch

    from core.models.quantize import quantizable, quantize_frozen

    own = [(p, t) for p, t in owner._parameters.items() if t is not None]
    for pname, meta in own:
        if id(meta) in filled:  # a tied parameter: what its first owner holds now
            _, first, first_name = filled[id(meta)]
            owner._parameters[pname] = first._parameters[first_name]
            continue
        # Only the owner keeps the values: once quantized, the float copy is freed.
        full = f"{name}.{pname}" if name else pname
        owner._parameters[pname] = torch.nn.Parameter(stream.fill(full, owner, meta),
                                                      requires_grad=False)
        filled[id(meta)] = (meta, owner, pname)
    if own and scheme != "none" and quantizable(name, owner):
        quantize_frozen(owner, scheme, device)  # torchao moves the layer, then quantizes
        if where.type == "cpu":
            owner.to("cpu")
    else:
        for pname, param in list(owner._parameters.items()):
            if param is not None and param.device != where:
                owner._parameters[pname] = torch.nn.Parameter(param.data.to(where),
                                                              requires_grad=False)
    for bname, buffer in list(owner._buffers.items()):
        if buffer is not None:
            owner._buffers[bname] = buffer.to(where)

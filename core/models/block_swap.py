"""model.blocks_to_swap: the first N of the denoiser's repeated blocks live in host memory
and come to the GPU one block ahead of use, so a base larger than the card trains.

How it works, for one stack of blocks (core/models/blocks.py's `denoiser_stacks`: the
family declares them; nothing here names a family):
- Placement (`place_denoiser`): the swapped blocks stay on the CPU (quantized on the GPU
  one at a time first, when model.quantize asks) while everything else goes to the GPU.
- `BlockSwapper` keeps each swapped block's frozen tensors (base weights and buffers) in
  host memory, pinned on a CUDA machine. Trainable parameters (LoRA, DoRA magnitudes)
  move to the GPU with their optimizer states and never swap.
- A forward pre-hook on every block of the stack puts the block's device copies in place
  (waiting for the copy started one block earlier on a side CUDA stream) and starts the
  copy of the next swapped block in the direction the blocks run: forward 0..K-1 in a
  forward pass, K-1..0 in the backward, where gradient checkpointing runs each block's
  forward again just before its backward. A forward hook puts the host tensors back.
- A block whose recomputed forward was stopped early by checkpointing (its forward hook
  never runs) goes back when the next block starts; the last one of a backward stays
  until the next pass starts.
- Putting them back replaces the module's Parameter objects and never changes a tensor
  autograd saved: the device copy a recomputed block saved for its backward lives until
  that backward is done, then is freed. Without checkpointing autograd would keep every
  block's device copy from the forward to the backward, so the check requires it.
- The frozen weights never change, so nothing is copied back (musubi-tuner's H2D-only
  swap): a block leaves the GPU by dropping its device copy.

Each swapped block is therefore copied in once per forward and once more per backward,
and at most two of them are on the device at a time outside the backward's saved ones
(the one running and the one being copied).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol


class Mover(Protocol):
    """Copies tensors to the device: `start` begins the copies of one block and returns a
    handle, `finish` gives the device tensors, ready for the compute stream."""

    def start(self, tensors: list[Any]) -> Any: ...

    def finish(self, handle: Any) -> list[Any]: ...


class DeviceMover:
    """Copies on a side CUDA stream (non-blocking from pinned memory) so the next block's
    transfer overlaps the current block's compute; on a CPU device a plain `.to`."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def start(self, tensors: list[Any]) -> Any:
        import torch

        if self.stream is None:
            return [t.to(self.device) for t in tensors], None
        # The side stream allocates the copies: waiting for the compute stream's queued
        # work first means memory a finished block freed is never overwritten while a
        # kernel still reads it.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            moved = [t.to(self.device, non_blocking=True) for t in tensors]
            done = torch.cuda.Event()
            done.record(self.stream)
        return moved, done

    def finish(self, handle: Any) -> list[Any]:
        import torch

        moved, done = handle
        if done is not None:
            torch.cuda.current_stream(self.device).wait_event(done)
        return moved


@dataclass
class _Frozen:
    """One frozen tensor of a swapped block: where it sits and its host copy."""

    module: Any
    name: str
    buffer: bool
    host: Any


def frozen_tensors(block: Any, pin: bool, skip: set[int] | None = None) -> list[_Frozen]:
    """The block's frozen parameters and its buffers, with their host copies put in
    place (pinned when `pin` and the tensor is a plain one: quantized tensor subclasses
    are copied unpinned, which is slower but correct). `skip`: ids of tensors another
    holder keeps (a parked expert's swapped blocks stay the swapper's)."""
    skip = skip or set()
    out = []
    for module in block.modules():
        for name, param in module._parameters.items():
            if param is not None and not param.requires_grad and id(param) not in skip:
                host = _to_host(param, pin)
                module._parameters[name] = host
                out.append(_Frozen(module, name, False, host))
        for name, buffer in module._buffers.items():
            if buffer is not None and id(buffer) not in skip:
                host = _to_host(buffer, pin)
                module._buffers[name] = host
                out.append(_Frozen(module, name, True, host))
    return out


def _to_host(tensor: Any, pin: bool) -> Any:
    import torch

    on_cpu = tensor if tensor.device.type == "cpu" else tensor.to("cpu")
    plain = type(on_cpu) in (torch.Tensor, torch.nn.Parameter)
    if pin and plain:
        on_cpu = on_cpu.data.pin_memory()
    if isinstance(tensor, torch.nn.Parameter) and not isinstance(on_cpu, torch.nn.Parameter):
        return torch.nn.Parameter(on_cpu, requires_grad=False)
    return on_cpu


def _put(frozen: _Frozen, tensor: Any) -> None:
    import torch

    if frozen.buffer:
        frozen.module._buffers[frozen.name] = tensor
    elif isinstance(tensor, torch.nn.Parameter):
        frozen.module._parameters[frozen.name] = tensor
    else:
        frozen.module._parameters[frozen.name] = torch.nn.Parameter(tensor, requires_grad=False)


class BlockSwapper:
    """Swaps the first `count` blocks of `blocks` (forward order) through `mover`."""

    def __init__(self, blocks: list[Any], count: int, device: Any,
                 mover: Mover | None = None, pin: bool = False) -> None:
        if not 0 < count <= len(blocks):
            raise ValueError(f"model.blocks_to_swap = {count}: this denoiser has "
                             f"{len(blocks)} blocks to swap; set 1 to {len(blocks)}")
        self.blocks = blocks
        self.count = count
        self.mover = mover or DeviceMover(device)
        for block in blocks[:count]:  # what trains stays on the device
            for param in block.parameters():
                if param.requires_grad:
                    param.data = param.data.to(device)
        self.frozen = {i: frozen_tensors(blocks[i], pin) for i in range(count)}
        self.resident: set[int] = set()
        self.pending: dict[int, Any] = {}
        self.hooks = [handle for i, block in enumerate(blocks) for handle in (
            block.register_forward_pre_hook(self._pre_hook(i)),
            block.register_forward_hook(self._post_hook(i)))]

    def _pre_hook(self, index: int) -> Any:
        def hook(module: Any, args: Any) -> None:
            self.before(index)
        return hook

    def _post_hook(self, index: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            self.after(index)
        return hook

    def before(self, index: int) -> None:
        """Block `index` is about to run: its weights in place, the next one on its way
        (the one before it when this is a recomputed forward inside the backward)."""
        # Blocks run one at a time, so any other block in place is done. Its forward
        # hook may not have run: checkpointing stops a recomputed forward early once it
        # has what the backward needs.
        for done in self.resident - {index}:
            self.after(done)
        if index < self.count:
            self._bring(index)
        ahead = index - 1 if in_backward() else index + 1
        if 0 <= ahead < self.count and ahead not in self.resident and ahead not in self.pending:
            self.pending[ahead] = self.mover.start([f.host for f in self.frozen[ahead]])

    def after(self, index: int) -> None:
        """Block `index` ran: a swapped block's host tensors back in place."""
        if index in self.resident:
            for frozen in self.frozen[index]:
                _put(frozen, frozen.host)
            self.resident.discard(index)

    def _bring(self, index: int) -> None:
        if index in self.resident:
            return
        handle = self.pending.pop(index, None)
        if handle is None:
            handle = self.mover.start([f.host for f in self.frozen[index]])
        for frozen, tensor in zip(self.frozen[index], self.mover.finish(handle), strict=True):
            _put(frozen, tensor)
        self.resident.add(index)

    def remove(self) -> None:
        """The hooks off; every swapped block left on the host."""
        for handle in self.hooks:
            handle.remove()
        for index in list(self.resident):
            self.after(index)
        self.pending.clear()


def in_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread (as
    torch.utils.checkpoint asks it)."""
    import torch

    return torch._C._current_graph_task_id() != -1


class ModuleParking:
    """Whole modules (Wan 2.2's two experts) of which only those in use are on the device:
    `keep_only` puts the others' frozen tensors back in host memory and copies the
    needed ones in. Their trainable parameters stay on the device; tensors a swapper
    holds stay the swapper's. Call it only between steps (or without gradients): a
    module's checkpointed blocks read its weights again in the backward."""

    def __init__(self, modules: list[Any], device: Any, held_elsewhere: set[int],
                 mover: Mover | None = None, pin: bool = False) -> None:
        self.modules = modules
        self.mover = mover or DeviceMover(device)
        for module in modules:
            for param in module.parameters():
                if param.requires_grad:
                    param.data = param.data.to(device)
        self.frozen = [frozen_tensors(m, pin, held_elsewhere) for m in modules]
        self.resident: set[int] = set()  # all parked to start with

    def keep_only(self, needed: list[Any]) -> None:
        wanted = {i for i, m in enumerate(self.modules) if any(m is n for n in needed)}
        for index in self.resident - wanted:
            for frozen in self.frozen[index]:
                _put(frozen, frozen.host)
        self.resident &= wanted
        for index in sorted(wanted - self.resident):
            held = self.frozen[index]
            moved = self.mover.finish(self.mover.start([f.host for f in held]))
            for frozen, tensor in zip(held, moved, strict=True):
                _put(frozen, tensor)
            self.resident.add(index)


def held_ids(swappers: list[BlockSwapper]) -> set[int]:
    """The tensors the swappers keep on the host."""
    return {id(f.host) for s in swappers for frozen in s.frozen.values() for f in frozen}


def install(stacks: list[list[Any]], count: int, device: Any,
            mover: Mover | None = None) -> list[BlockSwapper]:
    """One swapper per stack (a two-expert model swaps `count` blocks of each)."""
    import torch

    pin = torch.device(device).type == "cuda"
    return [BlockSwapper(blocks, count, device, mover, pin) for blocks in stacks]


@contextlib.contextmanager
def set_aside(root: Any, blocks: list[Any]) -> Iterator[None]:
    """`blocks` out of `root` for the duration (an empty module in each one's place), so
    what is done to `root` (moving it to the GPU, quantizing it there) leaves them be."""
    import torch

    parents = {id(child): (parent, name) for parent in root.modules()
               for name, child in parent._modules.items() if child is not None}
    spots = [(*parents[id(block)], block) for block in blocks]
    for parent, name, _ in spots:
        parent._modules[name] = torch.nn.Module()
    try:
        yield
    finally:
        for parent, name, block in spots:
            parent._modules[name] = block


def place_denoiser(denoiser: Any, stacks: list[list[Any]], count: int, scheme: str,
                   device: Any, parked: list[Any] | None = None) -> None:
    """The denoiser onto `device`, quantized by `scheme` (core/models/quantize.py), except
    the first `count` blocks of each stack and the `parked` modules (a two-expert model's
    expert waiting its turn), which stay on the CPU (quantized on the device a block or
    a layer at a time, then brought back), for `install` and ModuleParking."""
    swapped = [block for blocks in stacks for block in blocks[:count]]
    parked = parked or []
    with set_aside(denoiser, swapped + parked):
        from core.models.quantize import quantize_frozen

        quantize_frozen(denoiser, scheme, device)
        for module in parked:  # its swapped blocks are still set aside
            quantize_on_host(module, scheme, device)
    for block in swapped:
        quantize_on_host(block, scheme, device)


def quantize_on_host(module: Any, scheme: str, device: Any) -> None:
    """`module` quantized by `scheme` on `device` piece by piece (each child, each block
    of a ModuleList), every piece back on the CPU before the next comes: the device never
    holds more than one piece. Nothing to do without quantization."""
    import torch

    from core.models.quantize import quantize_frozen

    if scheme == "none":
        return
    pieces = [c for child in module.children() for c in (
        child if isinstance(child, torch.nn.ModuleList) else [child])]
    # bitsandbytes' nf4 puts a new module in each layer's place, which a piece that is
    # itself a layer cannot do: the module as a whole then.
    if scheme == "nf4" and any(isinstance(p, torch.nn.Linear) for p in pieces):
        pieces = [module]
    for piece in pieces or [module]:
        quantize_frozen(piece, scheme, device)
        piece.to("cpu")


def repeated_layers(module: Any) -> list[Any]:
    """A text encoder's repeated layers, found without asking which model it is: its
    nn.ModuleList of two or more modules holding the most parameters (T5's encoder.block,
    CLIP's encoder.layers, an LLM's layers beside a vision tower's smaller blocks)."""
    import torch

    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    return list(max(lists, key=lambda m: sum(p.numel() for p in m.parameters()), default=[]))


def stream_layers(module: Any, device: Any, mover: Mover | None = None) -> list[BlockSwapper]:
    """`module` onto `device` but for its repeated layers, which stay in host memory and
    each come to the device as it runs (model.stream_text_encoders: a text encoder larger
    than the card builds the text cache). `unstream` undoes it."""
    import torch

    layers = repeated_layers(module)
    if not layers:
        module.to(device)
        return []
    with set_aside(module, layers):
        module.to(device)
    pin = torch.device(device).type == "cuda"
    swappers = [BlockSwapper(layers, len(layers), device, mover, pin)]
    module._streamed_layers = swappers  # what `unstream` takes off
    return swappers


def unstream(module: Any) -> None:
    """The swappers `stream_layers` put on `module` taken off (its layers stay on the
    host, where `module.to("cpu")` then finds them)."""
    for swapper in module.__dict__.pop("_streamed_layers", []):
        swapper.remove()

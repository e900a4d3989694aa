"""train.token_routing (TREAD, Krause et al. 2025): during a training step a random share
of the image tokens skips a contiguous range of the denoiser's middle blocks and is put
back, unchanged, after them, so those blocks run on fewer tokens (a faster step); the
blocks before and after see every token.

A family declares how its blocks carry their tokens in a `RoutingSpec` (`family.routing`;
None: the family cannot route and the check refuses the key); nothing here names a
family. How it is done:
- `install` changes the class of the denoiser's block ModuleLists to `RoutedBlocks`
  (core/models/routed_blocks.py): while a route is armed (`TokenRouter.step`, the
  trainer's forward and backward of one micro-batch), iterating a list yields the blocks
  of the routed range wrapped in a call that narrows their arguments to the kept tokens
  (the image tokens, their rotary embedding, per-token conditioning) and, after the last
  one, scatters the kept tokens back among the skipped ones. Unarmed (eval, validation,
  saving) the lists iterate as before.
- Why around the loop and not hooks on the blocks: a compiled block (train.compile)
  compiles its hooks with it, and a route drawn at every step would be a guard failing
  at every step; here the blocks, their hooks (model.blocks_to_swap), compiled code and
  parameter names (LoRA) stay as they are and only see fewer tokens.
- One draw per batch, not per item: these models' rotary tables have no batch axis, so
  every item keeps the same token positions and the table is sliced once.
- Gradient checkpointing: diffusers checkpoints each block call (non-reentrant), which
  calls the wrapper again in the backward; it then narrows the same saved inputs with
  the same draw (the route lives until the step's backward is done), so the recomputed
  tensors are the ones the forward saved.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Slot:
    """One argument of a block call: its position where diffusers passes it positionally
    (the gradient-checkpointing call) and its keyword where it passes keywords."""

    position: int
    name: str
    ndim: int = 0  # a per-token argument's rank (0: any), so no other axis is taken for it

    def get(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        return args[self.position] if len(args) > self.position else kwargs.get(self.name)

    def put(self, args: tuple, kwargs: dict[str, Any], value: Any) -> tuple[tuple, dict]:
        if len(args) > self.position:
            return args[:self.position] + (value,) + args[self.position + 1:], kwargs
        return args, {**kwargs, self.name: value}


@dataclass(frozen=True)
class RoutingSpec:
    """How a family's blocks take their image tokens, for train.token_routing.

    `hidden`: the image tokens [B, S, D]; `rope`: their rotary embedding (a tensor or a
    tuple of tensors) whose token axis is `rope_axis`, or None (positions added before
    the blocks, as SD3); `rope_part`: the one element of a rope tuple that holds the
    image rows (Qwen-Image's (image, text) pair; None: every element); `text`: the text
    tokens [B, T, D] when the rotary table covers the text first and the image tokens
    after it (Flux's joint ids), so its first T rows stay whole; `per_token`: arguments
    with one entry per image token on axis 1 when they have S there (Wan 2.2 TI2V's
    per-token timestep projections, Qwen-Image-Edit's modulate_index); `output`: the
    image tokens' place in the block's output tuple (None: the output is them).
    `start` and `end`: the routed range as fractions of the stack's blocks (the family's
    default; the config sets only the routed share of tokens)."""

    hidden: Slot
    rope: Slot | None = None
    rope_axis: int = 0
    rope_part: int | None = None
    text: Slot | None = None
    per_token: tuple[Slot, ...] = ()
    output: int | None = None
    start: float = 0.25
    end: float = 0.75

    def span(self, count: int) -> range:
        """The routed blocks of a stack of `count`: at least one."""
        first = min(int(count * self.start), count - 1)
        return range(first, max(first + 1, min(count, math.ceil(count * self.end))))


@dataclass
class Route:
    """One forward's draw: the kept token positions (sorted, shared by the batch) and
    the full hidden states entering the routed range."""

    keep: Any
    tokens: int
    full: Any = None


@dataclass
class TokenRouter:
    """Routes `fraction` of the image tokens around `span` of each stack (one stack per
    transformer: a two-expert model has two, each with its own route)."""

    spec: RoutingSpec
    fraction: float
    spans: list[range]
    armed: bool = False
    routes: dict[int, Route] = field(default_factory=dict)
    routed: int = 0  # image tokens routed around (batch items x tokens), since `take`
    seen: int = 0  # image tokens entering the routed range, since `take`

    @contextlib.contextmanager
    def step(self, training: bool) -> Iterator[None]:
        """Routes the forwards (and the backward's recomputed ones) inside, when
        `training` (the denoiser in train mode); the routes are dropped after."""
        self.armed = training and self.fraction > 0
        try:
            yield
        finally:
            self.armed = False
            self.routes.clear()

    def take(self) -> tuple[int, int]:
        """(routed, seen) since the last take, for the step's event."""
        counts, self.routed, self.seen = (self.routed, self.seen), 0, 0
        return counts

    def wrap(self, stack: int, offset: int, blocks: list[Any]) -> list[Any]:
        """The blocks of one list (its first at `offset` in its stack), those in the
        routed range wrapped."""
        span = self.spans[stack]
        return [_RoutedCall(self, stack, offset + i, b) if offset + i in span else b
                for i, b in enumerate(blocks)]

    def call(self, stack: int, index: int, block: Any, args: tuple,
             kwargs: dict[str, Any]) -> Any:
        span, spec = self.spans[stack], self.spec
        if index == span.start:
            self._draw(stack, spec.hidden.get(args, kwargs))
        route = self.routes.get(stack)
        if route is None:
            return block(*args, **kwargs)
        args, kwargs = self._narrow(route, index == span.start, args, kwargs)
        out = block(*args, **kwargs)
        return self._widen(route, out) if index == span.stop - 1 else out

    def _draw(self, stack: int, hidden: Any) -> None:
        """A new route at the range's first block in a forward with gradients (a
        recomputed forward inside the backward keeps the forward's)."""
        import torch

        from core.models.block_swap import in_backward

        if in_backward():
            return
        self.routes.pop(stack, None)
        if not torch.is_grad_enabled():
            return
        batch, tokens = hidden.shape[0], hidden.shape[1]
        kept = tokens - int(tokens * self.fraction)
        if kept >= tokens:
            return
        order = torch.randperm(tokens, device=hidden.device)
        self.routes[stack] = Route(order[:kept].sort().values, tokens)
        self.routed += batch * (tokens - kept)
        self.seen += batch * tokens

    def _narrow(self, route: Route, first: bool, args: tuple,
                kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        spec = self.spec
        if first:
            route.full = spec.hidden.get(args, kwargs)
            args, kwargs = spec.hidden.put(args, kwargs, route.full.index_select(1, route.keep))
        if spec.rope is not None:
            rope = spec.rope.get(args, kwargs)
            text = spec.text.get(args, kwargs).shape[1] if spec.text is not None else 0
            if spec.rope_part is None:
                rope = _slice_rope(rope, route, spec.rope_axis, text)
            else:  # the image part alone: the tuple's other parts are the text's
                part = _slice_rope(rope[spec.rope_part], route, spec.rope_axis, text)
                rope = type(rope)(part if i == spec.rope_part else r for i, r in enumerate(rope))
            args, kwargs = spec.rope.put(args, kwargs, rope)
        for slot in spec.per_token:
            value = slot.get(args, kwargs)
            rank = getattr(value, "ndim", 0)
            if rank >= 2 and rank == (slot.ndim or rank) and value.shape[1] == route.tokens:
                args, kwargs = slot.put(args, kwargs, value.index_select(1, route.keep))
        return args, kwargs

    def _widen(self, route: Route, out: Any) -> Any:
        """The block's kept tokens put back among the ones that skipped the range
        (out of place: autograd sends each token's gradient its own way)."""
        index = self.spec.output
        kept = out if index is None else out[index]
        full = route.full.index_copy(1, route.keep, kept.to(route.full.dtype))
        if index is None:
            return full
        return type(out)(full if i == index else part for i, part in enumerate(out))


def _slice_rope(rope: Any, route: Route, axis: int, text: int) -> Any:
    """The rotary table's rows of the kept tokens (the first `text` rows whole)."""
    import torch

    if rope is None:
        return None
    if isinstance(rope, (tuple, list)):
        return type(rope)(_slice_rope(part, route, axis, text) for part in rope)
    if rope.shape[axis] != text + route.tokens:
        raise ValueError(f"train.token_routing: a rotary table of {rope.shape[axis]} rows "
                         f"for {text} text and {route.tokens} image tokens")
    image = rope.narrow(axis, text, route.tokens).index_select(axis, route.keep)
    return torch.cat([rope.narrow(axis, 0, text), image], dim=axis) if text else image


class _RoutedCall:
    """A block of the routed range as the denoiser's loop calls it (directly or through
    checkpointing); anything else asked of it is the block's."""

    def __init__(self, router: TokenRouter, stack: int, index: int, block: Any) -> None:
        self._router, self._stack, self._index, self._block = router, stack, index, block

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._router.call(self._stack, self._index, self._block, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._block, name)


def install(spec: RoutingSpec, model: Any, stacks: list[list[Any]],
            fraction: float) -> TokenRouter:
    """Routing onto `model`'s block lists holding `stacks` (core.models.blocks.denoiser_stacks,
    forward order): the router that arms it."""
    import torch

    from core.models.routed_blocks import RoutedBlocks

    router = TokenRouter(spec, fraction, [spec.span(len(stack)) for stack in stacks])
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    for number, stack in enumerate(stacks):
        where = {id(block): i for i, block in enumerate(stack)}
        for blocks in lists:
            if len(blocks) and id(blocks[0]) in where:
                blocks.__class__ = RoutedBlocks
                blocks.__dict__["_routing"] = (router, number, where[id(blocks[0])])
    return router

"""The wiring of block swap, streamed text encoders and the parked Wan expert, each through
the code that runs it (core/models/block_swap.py, core/train/swapping.py,
core/models/modules.py, core/models/families/wan/experts.py).

On this CPU machine host and device are the same, and DeviceMover's `.to("cpu")` hands
back the very host tensor: a block "on the device" could not be told from one on the
host. `CloningMover` stands in for the copy a CUDA machine makes (a distinct tensor, here
a clone), recording what it copied; everything else is the real code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import small_config, tiny_with_blocks, train_events

from core.config import save_config
from core.models import block_swap
from core.models.block_swap import install
from core.models.blocks import denoiser_stacks
from core.models.registry import get_family
from core.models.tiny import resolve_model_path


class CloningMover:
    """The device copy as a distinct tensor (a clone), each copy's tensors recorded."""

    def __init__(self, device: Any = "cpu") -> None:
        self.copied: list[list[int]] = []  # ids of the host tensors of each copy

    def start(self, tensors: list) -> list:
        self.copied.append([id(t) for t in tensors])
        return [t.detach().clone() for t in tensors]

    def finish(self, handle: list) -> list:
        return handle


class CountingSwapper(block_swap.BlockSwapper):
    """A BlockSwapper that counts, as each block starts, how many of its blocks are on
    the device or on their way there. Every one made is kept in `made`."""

    made: list[CountingSwapper] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ran: list[int] = []
        self.on_device: list[int] = []
        CountingSwapper.made.append(self)

    def before(self, index: int) -> None:
        super().before(index)
        self.ran.append(index)
        self.on_device.append(len(self.resident | set(self.pending)))


def host_copies_in_place(frozen: list) -> bool:
    """Whether each of these frozen tensors' modules holds its host copy."""
    return all((f.module._buffers if f.buffer else f.module._parameters)[f.name] is f.host
               for f in frozen)


# ---------------------------------------------------------------- the prefetch


class OrderMover(CloningMover):
    """Records copies and block starts in one sequence: ("copy", block), ("run", block)."""

    def __init__(self) -> None:
        super().__init__()
        self.block_of: dict[int, int] = {}
        self.log: list[tuple[str, int]] = []

    def start(self, tensors: list) -> list:
        self.log.append(("copy", self.block_of[id(tensors[0])]))
        return super().start(tensors)


def test_the_next_block_is_copied_while_the_one_before_runs(tiny_workspace: Path):
    """Four swapped blocks: in the forward each block's copy starts before the block
    ahead of it runs (copies in order 0, 1, 2, 3), in the checkpointed backward's
    recomputed forwards in the reverse order."""
    family, c = tiny_with_blocks(tiny_workspace, "flux", num_layers=2, num_single_layers=2)
    [blocks] = denoiser_stacks(family, c.denoiser)
    assert len(blocks) == 4
    mover = OrderMover()
    [swapper] = install([blocks], 4, "cpu", mover)
    for index, frozen in swapper.frozen.items():
        mover.block_of.update({id(f.host): index for f in frozen})
    for index, block in enumerate(blocks):  # after the swapper's own hook
        block.register_forward_pre_hook(lambda *_, i=index: mover.log.append(("run", i)))

    texts = family.encode_prompts(c, ["a red circle"])
    batch = {k: torch.stack([t[k] for t in texts]) for k in texts[0]}
    latents = family.encode_images(c, torch.rand(1, 3, 64, 64) * 2 - 1)
    sample = family.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    family.loss(c, family.predict(c, sample, batch), sample).backward()

    forward = [("copy", 0), ("copy", 1), ("run", 0), ("copy", 2), ("run", 1), ("copy", 3),
               ("run", 2), ("run", 3)]
    backward = [("copy", 3), ("copy", 2), ("run", 3), ("copy", 1), ("run", 2), ("copy", 0),
                ("run", 1), ("run", 0)]
    assert mover.log == forward + backward
    assert [b for kind, b in mover.log if kind == "copy"][:4] == [0, 1, 2, 3]


# ---------------------------------------------------------------- the parked expert


def test_the_idle_expert_is_back_on_its_host_copies_after_the_switch(
        tiny_workspace: Path, monkeypatch: pytest.MonkeyPatch):
    """Wan 2.2's experts taking turns as the family sets them up (take_turns): after a
    batch of the high-noise expert's timesteps, then one of the low-noise expert's, the
    high one's frozen tensors are its host copies again and the low one's are device
    copies; and back."""
    monkeypatch.setattr(block_swap, "DeviceMover", CloningMover)
    family = get_family("wan")
    c = family.load(str(resolve_model_path("tiny:wan22", tiny_workspace)),
                    dtype=torch.float32, device="cpu")
    experts = c.denoiser
    family.experts.start_parking(experts, "cpu", set())
    parking = experts.parking
    texts = family.encode_prompts(c, ["a red circle"])
    batch = {k: torch.stack([t[k] for t in texts]) for k in texts[0]}
    latents = family.encode_images(c, torch.rand(1, 3, 5, 64, 64) * 2 - 1)

    def predict(offset: float) -> None:
        t = torch.tensor([experts.boundary_timestep + offset])
        sample = family.noise_and_target(c, latents, generator=torch.Generator(),
                                         timesteps=t)
        family.predict(c, sample, batch)  # with gradients: WanExperts.forward switches

    high, low = parking.frozen
    for offset, on_device, on_host in ((50, high, low), (-50, low, high), (50, high, low)):
        predict(offset)
        assert host_copies_in_place(on_host), "the idle expert is back on the host"
        assert not any(f.module._parameters.get(f.name) is f.host
                       for f in on_device if not f.buffer), "the expert in use is copied in"
    assert len(parking.mover.copied) == 3


# ---------------------------------------------------------------- in the trainer


def swap_run_events(tmp: Path, workspace: Path) -> list[dict]:
    """One step of the tiny Flux with a swapped block and streamed text encoders,
    trained in this process; its events."""
    cfg = small_config(tmp, images=2, family="flux")
    cfg.model.blocks_to_swap, cfg.model.stream_text_encoders = 1, True
    cfg.train.gradient_checkpointing = True
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 1, 100, 100
    return train_events(cfg, tmp, workspace)


def test_blocks_to_swap_and_streamed_encoders_take_effect_in_the_trainer(
        tmp_path: Path, tiny_workspace: Path, monkeypatch: pytest.MonkeyPatch):
    """model.blocks_to_swap = 1: the trainer's step runs the swapped block on copies
    brought in for its forward and again for its checkpointed backward, and leaves it on
    the host; model.stream_text_encoders: each text encoder (CLIP, T5) builds the text
    cache with its layers brought in one at a time, at most two on the device at once."""
    monkeypatch.setattr(block_swap, "DeviceMover", CloningMover)
    monkeypatch.setattr(block_swap, "BlockSwapper", CountingSwapper)
    monkeypatch.setattr(CountingSwapper, "made", [])
    events = swap_run_events(tmp_path, tiny_workspace)

    [swap] = [e for e in events if e["type"] == "block_swap"]
    assert swap["swapped"] == [1] and swap["blocks"] == [2]
    denoiser = [s for s in CountingSwapper.made if s.count < len(s.blocks)]
    streamed = [s for s in CountingSwapper.made if s.count == len(s.blocks)]
    [swapper] = denoiser
    assert swapper.ran.count(0) >= 2 and len(swapper.mover.copied) >= 2  # forward, backward
    assert len(streamed) == 2, "one streamed stack per text encoder"
    for encoder in streamed:
        layers = list(range(len(encoder.blocks)))
        assert len(layers) >= 2 and encoder.ran[:len(layers)] == layers
        assert max(encoder.on_device) <= 2
        assert len(encoder.mover.copied) >= len(layers)


def test_the_cache_builder_streams_the_text_encoders(tmp_path: Path, tiny_workspace: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    """The cache program (`--stage cache`, the Cache tab) loads with
    model.stream_text_encoders as the trainer does: each encoder's layers come in one at
    a time as a caption is encoded, at most two on the device at once."""
    from core.cache.main import load_for_caching

    monkeypatch.setattr(block_swap, "DeviceMover", CloningMover)
    monkeypatch.setattr(block_swap, "BlockSwapper", CountingSwapper)
    monkeypatch.setattr(CountingSwapper, "made", [])
    cfg = small_config(tmp_path, images=2, family="flux")
    cfg.model.stream_text_encoders, cfg.launch.cpu = True, True
    save_config(cfg, tmp_path / "config.toml")
    loaded = load_for_caching(tmp_path / "config.toml", tiny_workspace)
    assert loaded is not None
    _, family, components, _ = loaded
    family.encode_prompts(components, ["a red circle"])
    assert len(CountingSwapper.made) == 2, "one streamed stack per text encoder"
    for encoder in CountingSwapper.made:
        assert encoder.ran == list(range(len(encoder.blocks))) and len(encoder.blocks) >= 2
        assert max(encoder.on_device) <= 2

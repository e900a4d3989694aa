"""model.blocks_to_swap: transformer blocks kept in host memory and copied to the device
one block ahead of use (core/models/block_swap.py). On this CPU machine host and device
are the same, so the copies go through a recording test double that also poisons the
host copies: a block that ever ran on its host weights would give NaN."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import check_in_process, small_config, train_in_process
from safetensors.torch import load_file

from core.config import Config, save_config, validate_config
from core.models.block_swap import install, place_denoiser, stream_layers
from core.models.blocks import denoiser_stacks
from core.models.registry import get_family
from core.models.tiny import resolve_model_path
from core.train.setup import add_trainable


class PoisonedHostMover:
    """The device copy, recorded: which block each copy was for, and how many swapped
    blocks were on the 'device' when it started. The host tensors hold NaN; the copies
    hold the true values."""

    def __init__(self) -> None:
        self.true: dict[int, torch.Tensor] = {}
        self.block_of: dict[int, int] = {}
        self.copies: list[int] = []
        self.on_device: list[int] = []
        self.swapper = None

    def poison(self, swapper) -> None:
        self.swapper = swapper
        self.poison_all(swapper.frozen.items())

    def poison_all(self, held_by_index) -> None:
        """The true values kept for the copies; NaN in the host tensors."""
        for index, frozen in held_by_index:
            for held in frozen:
                self.true[id(held.host)] = held.host.detach().clone()
                self.block_of[id(held.host)] = index
                if held.host.is_floating_point():
                    held.host.data.fill_(float("nan"))

    def start(self, tensors: list) -> list:
        self.copies.append(self.block_of[id(tensors[0])])
        s = self.swapper
        self.on_device.append(len(s.resident) + len(s.pending) + 1)
        return [self.true[id(t)].clone() for t in tensors]

    def finish(self, handle: list) -> list:
        return handle


@pytest.fixture(scope="module")
def flux_folder(tiny_workspace: Path) -> Path:
    return resolve_model_path("tiny:flux", tiny_workspace)


def lora_flux(folder: Path):
    family = get_family("flux")
    c = family.load(str(folder), dtype=torch.float32, device="cpu")
    cfg = Config()
    cfg.model.family = "flux"
    cfg.train.lora_rank, cfg.train.gradient_checkpointing = 4, True
    torch.manual_seed(0)
    params = add_trainable(family, c.denoiser, cfg)
    for p in params:  # lora_B starts at zero: give every adapter a gradient path
        torch.nn.init.normal_(p, std=0.02)
    return family, c


def forward_backward(family, c) -> tuple[float, dict[str, torch.Tensor]]:
    texts = family.encode_prompts(c, ["a red circle", "a blue square"])
    batch = {k: torch.stack([t[k] for t in texts]) for k in texts[0]}
    pixels = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    latents = family.encode_images(c, pixels)
    sample = family.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0))
    loss = family.loss(c, family.predict(c, sample, batch), sample)
    loss.backward()
    loss = loss.detach()
    grads = {n: p.grad.clone() for n, p in c.denoiser.named_parameters() if p.requires_grad}
    return loss.item(), grads


def test_swapped_blocks_run_on_their_device_copies_copied_once_each_way(flux_folder):
    """Every swapped block's forward uses the copy (never the NaN host weights), each is
    copied in once in the forward and once more for its recomputed backward, and at most
    two swapped blocks are on the device at once; loss and gradients are the unswapped
    model's."""
    family, reference = lora_flux(flux_folder)
    expected_loss, expected_grads = forward_backward(family, reference)

    family, c = lora_flux(flux_folder)
    [blocks] = denoiser_stacks(family, c.denoiser)
    count = len(blocks)  # every block (the tiny Flux has one double and one single)
    mover = PoisonedHostMover()
    [swapper] = install([blocks], count, "cpu", mover)
    mover.poison(swapper)
    loss, grads = forward_backward(family, c)

    assert loss == pytest.approx(expected_loss, rel=1e-6)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-5, atol=1e-7)
    forward = list(range(count))
    assert mover.copies == forward + forward[::-1]
    assert max(mover.on_device) <= 2
    # Back on the host after the step but for the backward's last block, whose forward
    # checkpointing stopped early (it goes when the next pass starts).
    assert swapper.resident <= {0}
    for index, frozen in swapper.frozen.items():
        if index not in swapper.resident:
            assert all(f.module._parameters.get(f.name, f.module._buffers.get(f.name))
                       is f.host for f in frozen)
    # What trains stayed where the optimizer sees it: no LoRA weight was swapped.
    assert not any(f.name.startswith("lora_") for fs in swapper.frozen.values() for f in fs)


def test_no_grad_passes_copy_each_block_once(flux_folder):
    """The eval and validation run the blocks forward only: one copy per swapped block."""
    family, c = lora_flux(flux_folder)
    [blocks] = denoiser_stacks(family, c.denoiser)
    mover = PoisonedHostMover()
    [swapper] = install([blocks], len(blocks), "cpu", mover)
    mover.poison(swapper)
    with torch.no_grad():
        for _ in range(2):
            texts = family.encode_prompts(c, ["a red circle"])
            batch = {k: torch.stack([t[k] for t in texts]) for k in texts[0]}
            latents = family.encode_images(c, torch.rand(1, 3, 64, 64) * 2 - 1)
            sample = family.noise_and_target(c, latents, generator=torch.Generator())
            assert torch.isfinite(family.predict(c, sample, batch)).all()
    assert mover.copies == [0, 1, 0, 1]
    assert swapper.resident == set()


def test_streamed_text_encoders_encode_as_the_whole_ones(flux_folder):
    """model.stream_text_encoders: each encoder's repeated layers (CLIP's and T5's) run on
    their device copies, copied once each per encode, and the embeddings are the same."""
    family = get_family("flux")
    c = family.load(str(flux_folder), dtype=torch.float32, device="cpu")
    prompts = ["a red circle", "a blue square"]
    expected = family.encode_prompts(c, prompts)
    streamed = []
    for encoder in c.text_encoders:
        mover = PoisonedHostMover()
        [swapper] = stream_layers(encoder, "cpu", mover)
        mover.poison(swapper)
        streamed.append((mover, swapper))
    got = family.encode_prompts(c, prompts)
    for mine, theirs in zip(got, expected, strict=True):
        for key, tensor in theirs.items():
            assert torch.equal(mine[key], tensor), key
    for mover, swapper in streamed:
        assert len(swapper.blocks) > 1 and mover.copies == list(range(len(swapper.blocks)))
        assert max(mover.on_device) <= 2


def test_placement_keeps_the_swapped_blocks_on_the_host_and_quantizes_them(flux_folder):
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    family = get_family("flux")
    c = family.load(str(flux_folder), dtype=torch.bfloat16, device="cpu")
    stacks = denoiser_stacks(family, c.denoiser)
    place_denoiser(c.denoiser, stacks, 1, "none", "meta")  # "meta": a device not the CPU
    blocks = stacks[0]
    assert {p.device.type for p in blocks[0].parameters()} == {"cpu"}
    assert {p.device.type for b in blocks[1:] for p in b.parameters()} == {"meta"}
    assert c.denoiser.x_embedder.weight.device.type == "meta"
    assert denoiser_stacks(family, c.denoiser) == stacks  # every block back in its place

    c = family.load(str(flux_folder), dtype=torch.bfloat16, device="cpu")
    stacks = denoiser_stacks(family, c.denoiser)
    place_denoiser(c.denoiser, stacks, 1, "int8", "cpu")
    for block in stacks[0]:  # quantized, the swapped one as the others
        assert is_traceable_wrapper_subclass(block.attn.to_q.weight)


def swap_run(tmp: Path, workspace: Path, family: str, swap: int, **model: object):
    cfg = small_config(tmp, images=4, family=family)
    cfg.model.blocks_to_swap = swap
    for key, value in model.items():
        setattr(cfg.model, key, value)
    cfg.train.gradient_checkpointing = True
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 3, 3, 3
    cfg.validation.prompts = ["a red circle"]
    cfg.launch.cpu = True
    save_config(cfg, tmp / "run.toml")
    assert train_in_process(tmp / "run.toml", workspace) == 0
    run = Path(cfg.output.dir)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["type"] in ("step", "eval")]
    swaps = [e for e in events if e["type"] == "block_swap"]
    return losses, load_file(run / "lora/pytorch_lora_weights.safetensors"), run, swaps


def assert_one_swapped_block_trains_as_in_place(tmp: Path, workspace: Path,
                                               family: str) -> None:
    """A family's model.blocks_to_swap = 1 run against its unswapped one: the same losses
    and LoRA, through an eval and a validation round, and block 1 the one swapped."""
    plain, plain_lora, _, none = swap_run(tmp / "a", workspace, family, 0)
    swapped, swapped_lora, _, [swap] = swap_run(tmp / "b", workspace, family, 1)
    assert swapped == plain and none == [] and swap["swapped"] == [1]
    assert swapped_lora.keys() == plain_lora.keys()
    assert all(torch.equal(swapped_lora[k], t) for k, t in plain_lora.items())


@pytest.mark.slow
@pytest.mark.parametrize("family,quantize,stream", [("flux", "none", True),
                                                    ("wan", "int8", False)])
def test_a_swapped_run_trains_as_the_unswapped_one(tmp_path: Path, tiny_workspace: Path,
                                                   family: str, quantize: str, stream: bool):
    """The trainer with blocks_to_swap N: the same step and eval losses and the same LoRA
    as with 0, through the eval and a validation round (Wan 2.1 with an int8 base: the
    swapped block quantized, then kept on the host; Flux with its text encoders streamed
    while the caches are built); its events say what swapped."""
    plain, plain_lora, _, none = swap_run(tmp_path / "a", tiny_workspace, family, 0,
                                          quantize=quantize)
    swapped, swapped_lora, run, [swap] = swap_run(tmp_path / "b", tiny_workspace, family, 1,
                                                  quantize=quantize,
                                                  stream_text_encoders=stream)
    assert swapped == plain and len(plain) == 4
    assert swapped_lora.keys() == plain_lora.keys()
    for key, tensor in plain_lora.items():
        assert torch.equal(swapped_lora[key], tensor), key
    assert none == [] and swap["swapped"] == [1] * len(swap["blocks"])
    # --resume from the last checkpoint into step 4: the same loss swapped or not
    resumed = [resume_to_step_4(tmp_path / name, tiny_workspace) for name in ("a", "b")]
    assert resumed[0] == resumed[1]
    assert swap["host_bytes"] > 0
    assert (run / "validation/step_000003/00.png").is_file() or \
        (run / "validation/step_000003/00.mp4").is_file()


def resume_to_step_4(folder: Path, workspace: Path) -> float:
    text = (folder / "run.toml").read_text().replace("max_steps = 3", "max_steps = 4")
    (folder / "run.toml").write_text(text)
    assert train_in_process(folder / "run.toml", workspace, "--resume", "latest") == 0
    events = (folder / "runs/run/events.jsonl").read_text().splitlines()
    [loss] = [e["loss"] for e in map(json.loads, events) if e.get("step") == 4
              and e["type"] == "step"]
    return loss


def problems_of(family: str, **changes: object) -> list:
    cfg = Config()
    cfg.model.family, cfg.model.path = family, f"tiny:{family}"
    cfg.model.blocks_to_swap = 2
    cfg.train.gradient_checkpointing = True
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return [p for p in validate_config(cfg) if p.level == "error" and p.where != "datasets"]


def test_what_swapping_cannot_combine_with_is_refused_naming_the_key():
    [unet] = problems_of("sdxl")
    assert unet.where == "model.blocks_to_swap" and "no transformer blocks" in unet.message
    [full] = problems_of("flux", train__method="full")
    assert full.where == "model.blocks_to_swap" and "full fine-tune" in full.message
    [plain] = problems_of("flux", train__gradient_checkpointing=False)
    assert plain.where == "train.gradient_checkpointing"
    assert problems_of("flux") == []


def test_more_blocks_than_the_model_has_exits_2_naming_the_maximum(tmp_path: Path,
                                                                   tiny_workspace: Path):
    cfg = small_config(tmp_path, images=2, family="flux")
    cfg.train.gradient_checkpointing = True
    cfg.model.blocks_to_swap = 99
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--no-ui", "--config", str(tmp_path / "run.toml"),
                            "--workspace", str(tiny_workspace), "--stage", "check")
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("error:")]
    assert "model.blocks_to_swap: 99" in line and "at most 2" in line, line


# Hand-computed frozen floats of one block (weights and biases; LayerNorms without affine
# hold none), dim 3072 = 24 heads x 128:
D = 3072
ATTN = 8 * (D * D + D) + 4 * 128  # q, k, v, out for image and text; four RMSNorm(128)
MOD = D * 6 * D + 6 * D  # AdaLayerNormZero's Linear(D, 6D)
MLP = (D * 4 * D + 4 * D) + (4 * D * D + D)  # gelu-approximate FeedForward
DOUBLE = 2 * MOD + ATTN + 2 * MLP  # Flux's double block and Qwen-Image's block alike
SINGLE = (D * 3 * D + 3 * D) + (D * 4 * D + 4 * D) + (5 * D * D + D) + 3 * (D * D + D) + 256


def estimate_with(family: str, workspace: Path, **model: object):
    from core.config import DatasetConfig, resolved
    from core.memory.estimate import estimate_memory

    cfg = Config()
    cfg.model.family, cfg.model.path = family, f"random:{family}"
    cfg.datasets.append(DatasetConfig(id="d", images="data", vae_cache="cache", resolution=512))
    cfg.train.mixed_precision, cfg.train.gradient_checkpointing = "bf16", True
    for key, value in model.items():
        setattr(cfg.model, key, value)
    estimate = estimate_memory(resolved(cfg, workspace), workspace, caches_built=True)
    return {p.name: p.bytes for p in estimate.parts}, estimate


def test_the_estimate_moves_the_swapped_blocks_to_host_memory(tiny_workspace: Path):
    """Flux (19 double blocks, then 38 single) and Qwen-Image (60 blocks) against block
    sizes computed by hand: the swapped blocks leave the frozen weights for pinned host
    memory and two of the largest stay in flight."""
    assert DOUBLE == 339_831_296 and SINGLE == 141_591_808
    plain, estimate = estimate_with("flux", tiny_workspace)
    assert estimate.max_blocks == 57 and estimate.host == []
    for count, held in ((10, 10 * DOUBLE), (25, 19 * DOUBLE + 6 * SINGLE)):
        parts, estimate = estimate_with("flux", tiny_workspace, blocks_to_swap=count)
        assert plain["frozen weights"] - parts["frozen weights"] == held * 2  # bf16
        assert parts["swap buffers"] == 2 * DOUBLE * 2
        assert [p.bytes for p in estimate.host] == [held * 2]
        assert any("host memory: " in line for line in estimate.lines())

    # int8: weights 1 byte, a bf16 scale per output row, biases and norms in bf16.
    weights = DOUBLE - (8 * D + 2 * 6 * D + 2 * 5 * D) - 4 * 128
    rows = 8 * D + 2 * 6 * D + 2 * 5 * D
    int8_block = weights + 2 * rows + 2 * (DOUBLE - weights)
    plain, estimate = estimate_with("qwen_image", tiny_workspace, quantize="int8")
    assert estimate.max_blocks == 60
    parts, estimate = estimate_with("qwen_image", tiny_workspace, quantize="int8",
                                    blocks_to_swap=45)
    assert plain["frozen weights"] - parts["frozen weights"] == 45 * int8_block
    assert parts["swap buffers"] == 2 * int8_block


def test_a_config_over_its_card_is_told_the_smallest_swap_that_fits(tiny_workspace: Path):
    """launch.gpu_memory_gib plans for a card this machine lacks; the advice names the
    smallest blocks_to_swap whose estimate fits it with the card presets' margin (1.5
    GiB), and that count does (launch.host_memory_gib: a machine with RAM for the pinned
    bf16 blocks, so that swapping, not quantizing, is the fit)."""
    parts, estimate = estimate_with("qwen_image", tiny_workspace)
    assert estimate.device_total_bytes is None or not estimate.planned
    from core.config import DatasetConfig, resolved
    from core.memory.estimate import estimate_memory

    cfg = Config()
    cfg.model.family, cfg.model.path = "qwen_image", "random:qwen_image"
    cfg.datasets.append(DatasetConfig(id="d", images="data", vae_cache="cache",
                                      resolution=1024))
    cfg.train.mixed_precision, cfg.train.gradient_checkpointing = "bf16", True
    cfg.launch.gpu_memory_gib, cfg.launch.host_memory_gib = 24, 512
    cfg.validation.prompts = []
    estimate = estimate_memory(resolved(cfg, tiny_workspace), tiny_workspace,
                               caches_built=True)
    count = estimate.swap_fit
    assert count is not None and 0 < count < 60
    [warned] = [line for line in estimate.lines() if "planned GPU" in line]
    assert f"model.blocks_to_swap = {count} fits 24 GiB" in warned
    gib = 1024 ** 3
    cfg.model.blocks_to_swap = count
    fits = estimate_memory(resolved(cfg, tiny_workspace), tiny_workspace, caches_built=True)
    assert fits.total_bytes <= 22.5 * gib and fits.swap_fit is None
    # the advice's figures are that count's estimate: per GPU, and the pinned host RAM
    per_gpu, host = max(fits.training_bytes, fits.validation_bytes), sum(
        p.bytes for p in fits.host)
    assert host > gib and f"{per_gpu / gib:.1f} GiB per GPU, {host / gib:.0f} GiB host RAM" \
        in warned, warned
    cfg.model.blocks_to_swap = count - 1
    short = estimate_memory(resolved(cfg, tiny_workspace), tiny_workspace, caches_built=True)
    assert short.total_bytes > 22.5 * gib
    assert short.swap_fit == (count if short.total_bytes > 24 * gib else None)


class ParkingMover(PoisonedHostMover):
    """PoisonedHostMover for a ModuleParking: which module each copy brings in."""

    def poison_parking(self, parking) -> None:
        self.poison_all(enumerate(parking.frozen))

    def start(self, tensors: list) -> list:
        self.copies.append(self.block_of[id(tensors[0])])
        return [self.true[id(t)].clone() for t in tensors]


def test_two_experts_take_turns_on_the_device(tiny_workspace: Path):
    """model.offload_inactive_expert: a batch of one expert's timesteps brings that
    expert in (the other waits on the host, never run: its host weights are NaN); a
    batch of both brings both; without gradients a pipeline's call of one expert alone
    brings that one. The prediction is the one with both experts always in place."""
    from core.models.block_swap import ModuleParking

    family = get_family("wan")
    c = family.load(str(resolve_model_path("tiny:wan22", tiny_workspace)),
                    dtype=torch.float32, device="cpu")
    experts = c.denoiser
    texts = family.encode_prompts(c, ["a red circle", "a blue square"])
    batch = {k: torch.stack([t[k] for t in texts]) for k in texts[0]}
    latents = family.encode_images(c, torch.rand(2, 3, 5, 64, 64) * 2 - 1)
    boundary = experts.boundary_timestep

    def predict(timesteps: list[float]) -> torch.Tensor:
        sample = family.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0),
                                         timesteps=torch.tensor(timesteps),
                                         noise=torch.zeros_like(latents))
        with torch.no_grad():
            return family.predict(c, sample, batch)

    cases = [[boundary + 50, boundary + 10], [boundary - 50, boundary - 10],
             [boundary + 50, boundary - 50]]
    expected = [predict(t) for t in cases]
    mover = ParkingMover()
    experts.parking = ModuleParking([experts.transformer, experts.transformer_2], "cpu",
                                    set(), mover)
    mover.poison_parking(experts.parking)
    got = [predict(t) for t in cases]
    for mine, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(mine, theirs)
    # high alone, low alone (high goes back), both (high comes back)
    assert mover.copies == [0, 1, 0]
    assert experts.parking.resident == {0, 1}


@pytest.mark.slow
def test_a_two_expert_run_with_the_idle_expert_offloaded_trains_as_with_both_in_place(
        tmp_path: Path, tiny_workspace: Path):
    """Wan 2.2 (tiny:wan22) with model.blocks_to_swap 1, which turns
    offload_inactive_expert "auto" on: the same losses and the same two LoRAs as with
    both experts on the device throughout."""
    runs = {}
    for name, swap, offload in (("plain", 0, "off"), ("offloaded", 1, "auto")):
        cfg = small_config(tmp_path / name, images=4, family="wan")
        cfg.model.path = "tiny:wan22"
        cfg.model.blocks_to_swap, cfg.model.offload_inactive_expert = swap, offload
        cfg.train.gradient_checkpointing = True
        cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 3, 3, 100
        cfg.validation.prompts = []
        cfg.launch.cpu = True
        save_config(cfg, tmp_path / name / "run.toml")
        assert train_in_process(tmp_path / name / "run.toml", tiny_workspace) == 0
        run = Path(cfg.output.dir)
        events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
        loras = {p.name: load_file(p) for p in sorted((run / "lora").glob("*.safetensors"))}
        runs[name] = ([e["loss"] for e in events if e["type"] in ("step", "eval")], loras)
    (plain, plain_loras), (offloaded, offloaded_loras) = runs["plain"], runs["offloaded"]
    assert offloaded == plain and len(plain) == 4
    assert offloaded_loras.keys() == plain_loras.keys() and len(plain_loras) >= 2
    for name, tensors in plain_loras.items():
        for key, tensor in tensors.items():
            assert torch.equal(offloaded_loras[name][key], tensor), (name, key)

"""The training loop's speed settings: no host sync per step beyond train.log_every, and
train.compile = "blocks" (compiled repeated blocks: same losses, compiles counted once,
refused with what it cannot combine with)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import REPO, small_config, step_losses, train_events, write_shapes

CORE = str(REPO / "core")
LOOP = str(REPO / "core" / "train" / "loop.py")
# What makes the host wait for the device (on a GPU): reading a value out of a tensor.
SYNCS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")


def _step_of_hot_loop(frame: Any) -> int | None:
    """The loop's `step` when `frame` is this project's code called from Loop.run's steps
    (not from a round: eval, validation, checkpoints, the end), else None."""
    if not frame.f_code.co_filename.startswith(CORE):
        return None
    while frame is not None:
        if frame.f_code.co_name in ("periodic", "finish"):
            return None
        if frame.f_code.co_name == "run" and frame.f_code.co_filename == LOOP:
            return frame.f_locals.get("step")
        frame = frame.f_back
    return None


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The loop steps at which this project's code read a tensor's value, one entry per
    read (the real trainer runs; the reads are counted on their way through)."""
    seen: list[int] = []
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def counting(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            step = _step_of_hot_loop(sys._getframe(1))
            if step is not None:
                seen.append(step)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return seen


def test_the_loop_reads_the_loss_only_every_log_every_steps(
        tmp_path: Path, tiny_workspace: Path, syncs: list[int]) -> None:
    losses = step_losses(tmp_path, 6, workspace=tiny_workspace, log_every=3)
    # Read at the first step (the start-up report), every third step and the last: the
    # steps between ran without the host waiting, and still report their own losses.
    assert sorted(syncs) == [1, 3, 6]
    assert len(losses) == 6 and all(loss > 0 for loss in losses)


def test_the_steps_between_reads_report_their_own_losses(tmp_path: Path,
                                                         tiny_workspace: Path) -> None:
    """train.log_every = 3 reports each step's own loss: the same six as the same run
    reading every step (log_every = 1), not a read step's loss repeated."""
    every_third = step_losses(tmp_path / "3", 6, workspace=tiny_workspace, log_every=3)
    assert every_third == step_losses(tmp_path / "1", 6, workspace=tiny_workspace,
                                      log_every=1)
    assert len(set(every_third)) == 6


def test_a_cpu_run_still_reads_every_step(tmp_path: Path, tiny_workspace: Path,
                                          syncs: list[int]) -> None:
    # train.log_every 0 (auto) on the CPU, where a read costs nothing: each step's loss
    # is read and reported as it ends, as before the setting existed.
    assert len(step_losses(tmp_path, 3, workspace=tiny_workspace)) == 3
    assert sorted(syncs) == [1, 2, 3]


def _check_errors(cfg: Any) -> list[str]:
    from core.config.checks import validate_config

    return [f"{p.where}: {p.message}" for p in validate_config(cfg) if p.level == "error"]


def test_compile_is_refused_with_what_it_cannot_combine_with(tmp_path: Path) -> None:
    cfg = small_config(tmp_path, family="sd15")
    cfg.train.compile = "blocks"
    assert any(e.startswith("train.compile") and "sd15" in e and "UNet" in e
               for e in _check_errors(cfg))
    cfg = small_config(tmp_path, family="flux")
    cfg.train.compile = "blocks"
    assert not _check_errors(cfg)
    cfg.model.quantize = "int8"
    cfg.model.blocks_to_swap, cfg.train.gradient_checkpointing = 2, True
    errors = [e for e in _check_errors(cfg) if e.startswith("train.compile")]
    assert any("model.quantize" in e for e in errors)
    assert any("model.blocks_to_swap" in e for e in errors)


def _two_bucket_run(folder: Path, workspace: Path, compile_mode: str) -> list[dict[str, Any]]:
    """Four steps of tiny SD3 (LoRA, gradient checkpointing) over two datasets of
    different aspect ratios (square and 2:1 images: two buckets, two token counts);
    the run's events."""
    cfg = small_config(folder, datasets=2, images=2, family="sd3")
    write_shapes(Path(cfg.datasets[1].images), 2, size=(64, 32))
    t = cfg.train
    t.max_steps, t.eval_every, t.eval_images, cfg.validation.every = 4, 100, 1, 100
    t.gradient_checkpointing, t.compile = True, compile_mode
    return train_events(cfg, folder, workspace)


@pytest.mark.slow
def test_compiled_blocks_train_to_the_same_losses(tmp_path: Path, tiny_workspace: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # aot_eager: dynamo's graphs and AOT autograd's forward/backward, without inductor's
    # C++ build (minutes on a small CPU); the GPU bench runs inductor (bench/peers.py).
    monkeypatch.setenv("TRAIN_COMPILE_BACKEND", "aot_eager")
    plain = _two_bucket_run(tmp_path / "plain", tiny_workspace, "off")
    compiled = _two_bucket_run(tmp_path / "compiled", tiny_workspace, "blocks")
    def losses(events: list[dict[str, Any]]) -> list[float]:
        return [e["loss"] for e in events if e["type"] == "step"]

    assert len(losses(compiled)) == 4
    assert losses(compiled) == pytest.approx(losses(plain), rel=1e-4, abs=1e-5)
    compiles = [e for e in compiled if e["type"] == "compile"]
    # One report, at the first step: its graphs (one per block class) serve every block,
    # both buckets and every later step (dynamic shapes); the eval at the end runs
    # uncompiled. The first step's time says what compiling cost.
    assert [e["step"] for e in compiles] == [1]
    assert 1 <= compiles[0]["graphs"] <= 2 and compiles[0]["first_step_s"] > 0


def test_compiled_blocks_share_graphs_and_serve_every_token_count(
        tiny_workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """compile_blocks as the trainer calls it, on an SD3 of four blocks: every block
    compiled, the model around them not. Blocks of one class share a graph: three for
    four blocks (the first block's input needs no gradient, the embedder before it being
    frozen; the last has no context output: each its own graph; the two between share
    one). A second token count (a 1:2 bucket) runs the same graphs, forward and
    backward, with no recompile (dynamic shapes)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from core.models.blocks import denoiser_stacks
    from core.train.compiling import BACKEND_ENV, compile_blocks
    from tests.conftest import tiny_with_blocks

    monkeypatch.setenv(BACKEND_ENV, "eager")  # dynamo's graphs, no code generated
    family, c = tiny_with_blocks(tiny_workspace, "sd3", num_layers=4)
    torch._dynamo.reset()
    counters.clear()
    said: list[str] = []
    compile_blocks(family, c.denoiser, "blocks", said.append)
    [stack] = denoiser_stacks(family, c.denoiser)
    assert len(stack) == 4 and all(b._compiled_call_impl is not None for b in stack)
    assert c.denoiser._compiled_call_impl is None  # not the whole model
    texts = family.encode_prompts(c, ["a red circle"])
    batch = {k: torch.stack([t[k] for t in texts]) for k in texts[0]}

    def graphs_after_a_step(height: int, width: int) -> int:
        latents = family.encode_images(c, torch.rand(1, 3, height, width) * 2 - 1)
        sample = family.noise_and_target(c, latents, generator=torch.Generator())
        family.loss(c, family.predict(c, sample, batch), sample).backward()
        return int(counters["stats"]["unique_graphs"])

    try:
        assert graphs_after_a_step(64, 64) == 3
        assert graphs_after_a_step(32, 64) == 3, "a new token count compiled again"
    finally:
        torch._dynamo.reset()
    assert said and "4 blocks" in said[0]

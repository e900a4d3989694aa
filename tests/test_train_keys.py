"""train.* keys that change the trained weights, each checked by what it does to them (so a
test fails when its key is read nowhere): lora_alpha (the LoRA's scale),
gradient_checkpointing, seed, eval_images, text_encoder_lr, max_grad_norm, ema_decay and optimizer =
"adamw8bit" (bitsandbytes, which runs on the CPU).

The trainer runs in this process on tiny SD1.5 (tests/conftest.py train_in_process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import small_config, train_in_process

from core.config import Config, save_config
from core.models.registry import get_family
from core.models.tiny import resolve_model_path


def run(tmp_path: Path, workspace: Path, steps: int, images: int = 2, **train: object) -> Path:
    """A short tiny-SD1.5 LoRA run on `images` images with `train` set; its run folder."""
    cfg = small_config(tmp_path, images=images)
    cfg.train.max_steps, cfg.train.checkpoint_every, cfg.train.eval_every = steps, 1000, 1000
    cfg.validation.every, cfg.validation.prompts = 1000, []
    cfg.launch.cpu = True
    for key, value in train.items():
        setattr(cfg.train, key, value)
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", workspace) == 0
    return Path(cfg.output.dir)


def tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(path)).items()}


def largest_up(weights: dict[str, torch.Tensor], prefix: str) -> float:
    """The largest |weight| of the LoRA up (B) matrices under `prefix`: zero at the start,
    so after one step it is what that step moved them by."""
    ups = [v for k, v in weights.items() if k.startswith(prefix)
           and (".up." in k or ".lora_B." in k)]
    assert ups, f"no LoRA up weights under {prefix!r}"
    return max(float(v.abs().max()) for v in ups)


def step_losses(run_dir: Path) -> list[float]:
    events = map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
    return [e["loss"] for e in events if e["type"] == "step"]


# ---------------------------------------------------------------- lora_alpha


def test_lora_alpha_sets_the_scale_of_every_adapter(tiny_workspace: Path) -> None:
    """scale = alpha / rank on the denoiser's and the text encoder's LoRA layers, as the
    trainer adds them; alpha 0 means alpha = rank (scale 1)."""
    from peft.tuners.lora import LoraLayer

    from core.train.setup import add_text_encoder_lora, add_trainable

    family = get_family("sd15")
    path = str(resolve_model_path("tiny:sd15", tiny_workspace))
    for alpha, scale in ((16.0, 4.0), (0.0, 1.0)):
        c = family.load(path)
        cfg = Config()
        cfg.train.lora_rank, cfg.train.lora_alpha = 4, alpha
        cfg.train.text_encoder_lora = True
        assert add_trainable(family, c.denoiser, cfg)
        assert add_text_encoder_lora(family, c, cfg)
        for module in (c.denoiser, *c.text_encoders):
            scales = {layer.scaling["default"] for layer in module.modules()
                      if isinstance(layer, LoraLayer)}
            assert scales == {scale}, (alpha, scales)


# ---------------------------------------------------------------- gradient_checkpointing


def test_gradient_checkpointing_is_turned_on_only_when_asked(tiny_workspace: Path) -> None:
    from core.train.setup import add_trainable

    family = get_family("sd15")
    path = str(resolve_model_path("tiny:sd15", tiny_workspace))
    for asked in (True, False):
        c = family.load(path)
        cfg = Config()
        cfg.train.gradient_checkpointing = asked
        assert add_trainable(family, c.denoiser, cfg)
        assert c.denoiser.is_gradient_checkpointing == asked


# ---------------------------------------------------------------- seed


def test_another_seed_draws_another_first_step(tmp_path: Path, tiny_workspace: Path) -> None:
    """train.seed seeds the noise, the timesteps and the LoRA's start: seed 1's first step
    has another loss and moves the LoRA elsewhere than seed 0's. One image, so the batch
    (it, twice) is the same at any seed. (The resume tests show one seed reproduces a run.)"""
    runs = {seed: run(tmp_path / str(seed), tiny_workspace, steps=1, images=1, seed=seed)
            for seed in (0, 1)}
    assert step_losses(runs[0]) != step_losses(runs[1])
    weights = [tensors(runs[seed] / "lora/pytorch_lora_weights.safetensors") for seed in runs]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


# ---------------------------------------------------------------- eval_images


def test_eval_images_sets_how_many_images_the_eval_scores(tmp_path: Path, tiny_workspace: Path,
                                                          monkeypatch) -> None:
    from core.train import loop

    scored: list[int] = []
    build = loop.build_eval_set

    def recording(*args, **kwargs):
        eval_set = build(*args, **kwargs)
        scored.append(sum(len(batch["latents"]) for batch in eval_set.batches))
        return eval_set

    monkeypatch.setattr(loop, "build_eval_set", recording)
    run(tmp_path, tiny_workspace, steps=1, images=4, eval_images=3)
    assert scored == [3]


# ---------------------------------------------------------------- text_encoder_lr


def test_text_encoder_lr_moves_the_encoders_lora_at_its_own_rate(
        tmp_path: Path, tiny_workspace: Path) -> None:
    """One AdamW step moves each weight by about its group's rate: 1e-3 for the UNet's
    LoRA, 1e-6 for the text encoder's (train.text_encoder_lr)."""
    run_dir = run(tmp_path, tiny_workspace, steps=1, learning_rate=1e-3,
                  text_encoder_lora=True, text_encoder_lr=1e-6)
    lora = tensors(run_dir / "lora/pytorch_lora_weights.safetensors")
    assert 5e-4 < largest_up(lora, "unet.") < 2e-3
    assert 0 < largest_up(lora, "text_encoder.") < 2e-6


# ---------------------------------------------------------------- max_grad_norm


def test_max_grad_norm_clips_the_gradient_before_the_step(tmp_path: Path,
                                                          tiny_workspace: Path) -> None:
    """AdamW's first step moves a weight by lr * g / (|g| + 1e-8): about lr for an
    unclipped gradient, under a tenth of it once the whole gradient is clipped to norm
    1e-9 (train.max_grad_norm)."""
    run_dir = run(tmp_path, tiny_workspace, steps=1, learning_rate=1e-3, max_grad_norm=1e-9)
    moved = largest_up(tensors(run_dir / "lora/pytorch_lora_weights.safetensors"), "unet.")
    assert 0 < moved < 1e-4


# ---------------------------------------------------------------- ema_decay


def test_saved_lora_is_the_ema_at_the_configured_decay(tmp_path: Path,
                                                       tiny_workspace: Path) -> None:
    """The LoRA saved at the end is the EMA of the raw weights of steps 1-3 (each step's
    checkpoint): diffusers' EMAModel takes step 1 as is, then decays by
    min(ema_decay, (1 + k) / (10 + k)) at its k-th update, k = 1, 2 (2/11 and 3/12:
    an ema_decay of 0.1 is below both, so it is the one used)."""
    run_dir = run(tmp_path, tiny_workspace, steps=3, learning_rate=1e-2, checkpoint_every=1,
                  ema=True, ema_decay=0.1)
    raw = [tensors(run_dir / f"checkpoints/step_{s:06d}/trainable.safetensors")
           for s in (1, 2, 3)]
    saved = tensors(run_dir / "lora/pytorch_lora_weights.safetensors")
    names = {k: "unet." + k.replace(".lora_A.default.", ".lora.down.")
             .replace(".lora_B.default.", ".lora.up.") for k in raw[0]}
    assert set(names.values()) == set(saved)
    for key, name in names.items():
        p1, p2, p3 = (r[key] for r in raw)
        want = 0.1 * (0.1 * p1 + 0.9 * p2) + 0.9 * p3
        torch.testing.assert_close(saved[name], want, rtol=1e-4, atol=1e-7)
    assert any(not torch.allclose(saved[n], raw[2][k]) for k, n in names.items())


# ---------------------------------------------------------------- adamw8bit


def test_adamw8bit_is_bitsandbytes_with_8bit_state() -> None:
    import bitsandbytes as bnb

    from core.train.setup import make_optimizer

    cfg = Config()
    cfg.train.optimizer, cfg.train.learning_rate, cfg.train.weight_decay = "adamw8bit", 3e-4, 0.05
    big = torch.nn.Parameter(torch.randn(64, 128))  # 8-bit state from 4096 elements on
    optimizer = make_optimizer([big], cfg)
    assert isinstance(optimizer, bnb.optim.AdamW8bit)
    assert (optimizer.param_groups[0]["lr"], optimizer.param_groups[0]["weight_decay"]) == (
        3e-4, 0.05)
    big.sum().backward()
    before = big.detach().clone()
    optimizer.step()
    assert optimizer.state[big]["state1"].dtype == torch.uint8
    assert not torch.equal(big.detach(), before)


@pytest.mark.parametrize("method", ["lora", "full"])
def test_a_run_trains_with_adamw8bit(tmp_path: Path, tiny_workspace: Path, method: str) -> None:
    run_dir = run(tmp_path, tiny_workspace, steps=2, optimizer="adamw8bit", method=method,
                  learning_rate=1e-3)
    losses = step_losses(run_dir)
    assert len(losses) == 2 and all(abs(x) < 1e3 for x in losses), losses
    if method == "lora":
        assert largest_up(tensors(run_dir / "lora/pytorch_lora_weights.safetensors"),
                          "unet.") > 5e-4

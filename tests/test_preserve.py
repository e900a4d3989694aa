"""Output preservation (datasets.N.preserve = "base", issue 52 item 4): a preserved
dataset's target is the frozen base's prediction on the same noisy input (the adapter
switched off for one no-grad forward), its loss weighted by datasets.N.preserve_weight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import small_config, train_in_process

from core.config import Config, DatasetConfig, save_config, validate_config


def _run(tmp: Path, workspace: Path, monkeypatch, steps: int, family: str = "sd15",
         weight: float = 1.0, unweighted: list[float] | None = None,
         **model: object) -> tuple[list[float], list[str]]:
    """`steps` steps of two datasets of 4 images (batch 2), d1 preserved (at `weight`)
    and drawn first (its sampling weight): each step's loss and the dataset its batch came
    from (the trainer's own batch plans, recorded on their way into micro_step); the
    family's losses before the trainer weighs them go into `unweighted`."""
    from core.models.registry import get_family
    from core.train import loop

    cfg = small_config(tmp, datasets=2, images=4, family=family)
    cfg.datasets[1].preserve, cfg.datasets[1].probability = "base", 1e6
    cfg.datasets[1].preserve_weight = weight
    for key, value in model.items():
        setattr(cfg.model, key, value)
    cfg.train.gradient_checkpointing = bool(model)
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = steps, 100, 100
    cfg.train.log_every, cfg.validation.prompts, cfg.launch.cpu = 1, [], True
    save_config(cfg, tmp / "config.toml")
    datasets: list[str] = []
    micro_step, fam = loop.micro_step, get_family(family)
    loss = fam.loss

    def recording_step(setup, cfg, batch_plan):
        datasets.append(batch_plan.dataset_id)
        return micro_step(setup, cfg, batch_plan)

    def recording_loss(*args, **kwargs):
        value = loss(*args, **kwargs)
        if unweighted is not None:
            unweighted.append(value.item())
        return value

    with monkeypatch.context() as patch:  # undone after, so a second run records anew
        patch.setattr(loop, "micro_step", recording_step)
        patch.setattr(fam, "loss", recording_loss)
        assert train_in_process(tmp / "config.toml", workspace) == 0
    events = (Path(cfg.output.dir) / "events.jsonl").read_text().splitlines()
    losses = [e["loss"] for e in map(json.loads, events) if e["type"] == "step"]
    assert len(losses) == len(datasets) == steps
    return losses, datasets


def test_a_fresh_lora_matches_the_base_exactly_then_stays_close_on_the_preserved_dataset(
        tmp_path: Path, tiny_workspace: Path, monkeypatch, capsys):
    """A fresh LoRA (zero up) predicts what the base does, so the preserved dataset's
    loss is exactly 0 (and its zero gradient leaves the LoRA fresh) until an ordinary
    batch trains it; the ordinary dataset's loss is not 0. In the second epoch, after the
    ordinary batches moved the LoRA, the preserved batches' loss (how far the LoRA moved
    the prediction from the base's) is above 0 but far below the ordinary ones'. The
    start-up names the preserved dataset and its extra forward; preserve_weight scales
    that dataset's loss."""
    unweighted: list[float] = []
    losses, datasets = _run(tmp_path, tiny_workspace, monkeypatch, 8, weight=2.0,
                            unweighted=unweighted)
    assert datasets == ["d1", "d1", "d0", "d0"] * 2, datasets
    assert losses[:2] == [0.0, 0.0] and all(loss > 0 for loss in losses[2:]), losses
    preserved, ordinary = losses[4:6], losses[2:4] + losses[6:]
    assert max(preserved) < 0.01 * min(ordinary), (preserved, ordinary)
    expected = [u * (2.0 if d == "d1" else 1.0)
                for u, d in zip(unweighted[:8], datasets, strict=True)]
    assert losses == pytest.approx(expected, rel=1e-6), (losses, unweighted)
    out = capsys.readouterr().out
    assert "output preservation: 'd1' (weight 2): the target is the base model's " \
           "prediction" in out and "one extra no-grad forward" in out, out


def test_preserve_through_swapped_blocks(tmp_path: Path, tiny_workspace: Path, monkeypatch):
    """model.blocks_to_swap: the extra no-grad forward runs through the same swapped
    blocks (Flux), and the run takes the same losses as without swapping."""
    swapped = _run(tmp_path / "a", tiny_workspace, monkeypatch, 3, "flux", blocks_to_swap=1)
    plain = _run(tmp_path / "b", tiny_workspace, monkeypatch, 3, "flux", blocks_to_swap=0)
    assert swapped == plain
    events = (tmp_path / "a/runs/run/events.jsonl").read_text().splitlines()
    [swap] = [e for e in map(json.loads, events) if e["type"] == "block_swap"]
    assert 1 in swap["swapped"], swap  # a block did swap
    assert swapped[0][:2] == [0.0, 0.0] and swapped[0][2] > 0, swapped


@pytest.mark.parametrize("kind", ["lora", "dora", "lokr", "loha"])
def test_the_base_prediction_is_the_model_with_its_adapter_disabled(tiny_sd15, kind: str):
    """adapters_off gives what the model gives with peft's adapters disabled (diffusers'
    disable_adapters), not what the trained adapter gives; the adapter and its trainable
    weights are as they were after."""
    import copy

    from core.models.registry import get_family
    from core.train.preserve import adapters_off
    from core.train.setup import add_trainable

    _, components = tiny_sd15
    unet = copy.deepcopy(components.denoiser)
    cfg = Config()
    cfg.train.lora_kind, cfg.train.lora_rank = kind, 4
    add_trainable(get_family("sd15"), unet, cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in unet.parameters():
            if param.requires_grad:  # every adapter weight away from its fresh state
                param.add_(torch.randn_like(param) * 0.1)
    trainable = [name for name, p in unet.named_parameters() if p.requires_grad]
    noisy = torch.randn(1, unet.config.in_channels, 8, 8)
    text = torch.randn(1, 4, unet.config.cross_attention_dim)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return unet(noisy, torch.tensor([500]), encoder_hidden_states=text).sample

    on = forward()
    with adapters_off(unet):
        off = forward()
    after = forward()
    unet.disable_adapters()
    disabled = forward()
    unet.enable_adapters()
    assert torch.equal(off, disabled) and torch.equal(after, on)
    assert not torch.allclose(on, off)
    assert [name for name, p in unet.named_parameters() if p.requires_grad] == trainable


def _errors(**changes: object) -> dict[str, str]:
    cfg = Config()
    cfg.model.family, cfg.model.path = "sd15", "tiny:sd15"
    cfg.datasets.append(DatasetConfig(id="d", images="data", vae_cache="cache",
                                      preserve="base"))
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(cfg.datasets[0] if section == "ds" else getattr(cfg, section), name, value)
    return {p.where: p.message for p in validate_config(cfg) if p.level == "error"}


def test_the_check_refuses_what_preservation_cannot_do_naming_the_key():
    assert "datasets.0.preserve" not in _errors()
    assert "datasets.0.preserve_weight" not in _errors(ds__preserve_weight=0.5)
    full = _errors(train__method="full")["datasets.0.preserve"]
    assert "train.method = \"full\"" in full and "no adapter" in full
    assert "must be one of" in _errors(ds__preserve="prior")["datasets.0.preserve"]
    for weight in (0.0, -1.0):
        message = _errors(ds__preserve_weight=weight)["datasets.0.preserve_weight"]
        assert "greater than 0" in message, message


def test_the_check_notes_the_preserved_datasets(tmp_path: Path):
    from core.check import run_check

    cfg = small_config(tmp_path, datasets=2, images=2)
    cfg.datasets[1].preserve = "base"
    lines = run_check(cfg, tmp_path, estimate=False).lines()
    assert "note: output preservation: 'd1' (weight 1): the target is the base model's " \
           "prediction (the LoRA switched off), one extra no-grad forward per sample of " \
           "these datasets" in lines, lines


def test_the_memory_estimate_counts_the_preserved_output(tiny_workspace: Path):
    from core.config import resolved
    from core.memory.estimate import estimate_memory

    def parts(preserve: str) -> dict[str, int]:
        cfg = Config()
        cfg.model.family, cfg.model.path = "flux", "random:flux"
        cfg.datasets.append(DatasetConfig(id="d", images="data", vae_cache="cache",
                                          resolution=512, preserve=preserve))
        estimate = estimate_memory(resolved(cfg, tiny_workspace), tiny_workspace,
                                   caches_built=True)
        return {p.name: p.bytes for p in estimate.parts}

    plain, preserved = parts(""), parts("base")
    assert "preserved base output" not in plain
    assert preserved.pop("preserved base output") > 0 and preserved == plain

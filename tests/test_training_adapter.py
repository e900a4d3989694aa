"""model.training_adapter (issue 52 item 1): LoRA files fused into the frozen base for
training only; never saved with the run's LoRA; validation samples without them unless
validation.with_training_adapter."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import small_config, train_in_process

from core.config import resolved, save_config

MODULES = ("down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q",
           "mid_block.attentions.0.transformer_blocks.0.attn2.to_v")


def write_adapter(path: Path, unet, rank: int = 2, alpha: float | None = None,
                  modules: tuple[str, ...] = MODULES, prefix: str = "unet.") -> Path:
    """A LoRA file for `unet`'s `modules` (random down and up, seed 0)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for name in modules:
        weight = unet.get_submodule(name).weight
        tensors[f"{prefix}{name}.lora_A.weight"] = torch.randn(rank, weight.shape[1],
                                                               generator=gen)
        tensors[f"{prefix}{name}.lora_B.weight"] = torch.randn(weight.shape[0], rank,
                                                               generator=gen) * 0.1
        if alpha is not None:
            tensors[f"{prefix}{name}.alpha"] = torch.tensor(alpha)
    save_file(tensors, str(path))
    return path


def test_fused_weights_are_the_base_plus_each_update_and_come_out_exactly(tiny_sd15,
                                                                          tmp_path: Path):
    """W + (alpha / rank)·B·A per module, both files summed; taking them out for a round
    gives the base back, and after the round the fused weights are back bit for bit."""
    from core.models.training_adapter import adapters_taken_out, fuse_adapters

    _, components = tiny_sd15
    unet = copy.deepcopy(components.denoiser)
    base = {m: unet.get_submodule(m).weight.detach().clone() for m in MODULES}
    first = write_adapter(tmp_path / "a.safetensors", unet, alpha=1.0)  # scale 1/2
    second = write_adapter(tmp_path / "b.safetensors", unet, modules=MODULES[:1])
    assert fuse_adapters(unet, [str(first), str(second)]) == 3
    from safetensors.torch import load_file

    a, b = load_file(str(first)), load_file(str(second))
    for m in MODULES:
        expected = base[m] + 0.5 * a[f"unet.{m}.lora_B.weight"] @ a[f"unet.{m}.lora_A.weight"]
        if m in MODULES[:1]:
            expected += b[f"unet.{m}.lora_B.weight"] @ b[f"unet.{m}.lora_A.weight"]
        assert torch.allclose(unet.get_submodule(m).weight, expected, atol=1e-5), m
    fused = {m: unet.get_submodule(m).weight.detach().clone() for m in MODULES}
    with adapters_taken_out(unet, [str(first), str(second)], keep=False):
        for m in MODULES:
            assert torch.allclose(unet.get_submodule(m).weight, base[m], atol=1e-5), m
    for m in MODULES:
        assert torch.equal(unet.get_submodule(m).weight, fused[m]), m


def test_an_adapter_for_another_model_changes_nothing_and_names_a_module(tiny_sd15,
                                                                        tmp_path: Path):
    from core.models.training_adapter import TrainingAdapterError, fuse_adapters

    _, components = tiny_sd15
    unet = copy.deepcopy(components.denoiser)
    good = write_adapter(tmp_path / "good.safetensors", unet)
    other = write_adapter(tmp_path / "other.safetensors", unet)
    from safetensors.torch import load_file, save_file

    renamed = {k.replace("attn1.to_q", "attn1.to_qkv"): v for k, v in load_file(str(other)).items()}
    save_file(renamed, str(other))
    before = [p.detach().clone() for p in unet.parameters()]
    with pytest.raises(TrainingAdapterError, match="to_qkv.*made for another model"):
        fuse_adapters(unet, [str(good), str(other)])
    assert all(torch.equal(p, q) for p, q in zip(unet.parameters(), before, strict=True))


def _run(tmp: Path, workspace: Path, monkeypatch, adapter: Path | None,
         with_adapter: bool = False) -> tuple[list[float], list[float], Path]:
    """Three steps of an sd15 LoRA run validating at step 2: the losses, the sum of
    MODULES[0]'s base weight at each validation round, and the run folder."""
    from core.train import loop

    cfg = small_config(tmp, images=2)
    cfg.model.training_adapter = [str(adapter)] if adapter else []
    cfg.validation.with_training_adapter = with_adapter
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 3, 100, 2
    cfg.validation.steps, cfg.validation.resolution, cfg.launch.cpu = 2, 64, True
    save_config(cfg, tmp / "config.toml")
    seen: list[float] = []
    generate = loop.generate_validation_images

    def recording(family, components, *args, **kwargs):
        weight = components.denoiser.get_submodule(MODULES[0]).base_layer.weight \
            if hasattr(components.denoiser.get_submodule(MODULES[0]), "base_layer") else \
            components.denoiser.get_submodule(MODULES[0]).weight
        seen.append(float(weight.double().sum()))
        return generate(family, components, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(loop, "generate_validation_images", recording)
        assert train_in_process(tmp / "config.toml", workspace) == 0
    run = Path(cfg.output.dir)
    events = (run / "events.jsonl").read_text().splitlines()
    losses = [e["loss"] for e in map(json.loads, events) if e["type"] == "step"]
    return losses, seen, run


@pytest.mark.slow  # three short runs
def test_a_run_trains_on_the_fused_base_saves_only_its_lora_and_validates_without_it(
        tmp_path: Path, tiny_workspace: Path, tiny_sd15, monkeypatch, capsys):
    from safetensors.torch import load_file

    _, components = tiny_sd15
    base_sum = float(components.denoiser.get_submodule(MODULES[0]).weight.double().sum())
    adapter = write_adapter(tmp_path / "adapter.safetensors", components.denoiser)
    plain, plain_seen, plain_run = _run(tmp_path / "a", tiny_workspace, monkeypatch, None)
    fused, fused_seen, fused_run = _run(tmp_path / "b", tiny_workspace, monkeypatch, adapter)
    kept, kept_seen, _ = _run(tmp_path / "c", tiny_workspace, monkeypatch, adapter, True)
    assert fused != plain  # the adapter is in the weights the LoRA trains on
    assert plain_seen == pytest.approx([base_sum] * 2)
    assert fused_seen == pytest.approx([base_sum] * 2)  # validation: the base, without it
    assert kept_seen[0] != pytest.approx(base_sum)  # with_training_adapter: still fused
    lora = "lora/pytorch_lora_weights.safetensors"
    assert load_file(str(fused_run / lora)).keys() == load_file(str(plain_run / lora)).keys()
    out = capsys.readouterr().out
    assert "training adapter: 1 file(s), 2 module(s) fused into the base for training " \
           "only (not saved; validation samples without it)" in out, out


def _check(cfg, workspace: Path) -> list[str]:
    from core.config.training_adapter import training_adapter_problems

    return [str(p) for p in training_adapter_problems(resolved(cfg, workspace))]


def test_the_check_names_an_adapter_for_another_model(tmp_path: Path, tiny_sd15):
    """A random:flux base has none of an SD1.5 UNet's modules: named at check, offline."""
    _, components = tiny_sd15
    adapter = write_adapter(tmp_path / "sd15.safetensors", components.denoiser)
    cfg = small_config(tmp_path, images=1, family="flux")
    cfg.model.path, cfg.model.training_adapter = "random:flux", [str(adapter)]
    [problem] = _check(cfg, tmp_path)
    assert "model.training_adapter" in problem and "adapts 2 module(s) that random:flux " \
           "does not have (e.g. down_blocks_1_attentions_0" in problem, problem


def test_the_check_refuses_what_cannot_work(tmp_path: Path, tiny_sd15):
    _, components = tiny_sd15
    adapter = write_adapter(tmp_path / "a.safetensors", components.denoiser)
    cfg = small_config(tmp_path, images=1)
    cfg.model.training_adapter = [str(tmp_path / "missing.safetensors")]
    assert "missing.safetensors is not a file" in _check(cfg, tmp_path)[0]
    cfg.model.training_adapter = [str(adapter)]
    assert _check(cfg, tmp_path) == []
    cfg.model.quantize = "int8"
    [problem] = _check(cfg, tmp_path)
    assert problem.startswith("error: validation.with_training_adapter: off") \
        and "quantized" in problem, problem
    cfg.validation.with_training_adapter = True
    assert _check(cfg, tmp_path) == []
    cfg.train.method = "full"
    assert "is for a LoRA run" in _check(cfg, tmp_path)[0]

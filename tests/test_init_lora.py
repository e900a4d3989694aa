"""train.init_lora: a LoRA this tool saved (its diffusers file and its kohya/ComfyUI file)
starts a new run's adapter with the same weights; a rank or target mismatch is named."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import small_config, train_in_process

from core.config import Config
from core.models.init_lora import InitLoraError, load_init_lora


def _model(family_name: str, workspace: Path, rank: int, alpha: float,
           targets: str = "attention", seed: int | None = None):
    """A fresh tiny model with an adapter; `seed` fills B (zero at init) with noise."""
    import torch

    from core.models.registry import get_family
    from core.models.tiny import materialize_tiny
    from core.train.setup import add_trainable

    family = get_family(family_name)
    comps = family.load(str(materialize_tiny(family_name, workspace)))
    cfg = Config()
    cfg.train.lora_rank, cfg.train.lora_alpha, cfg.train.lora_targets = rank, alpha, targets
    add_trainable(family, comps.denoiser, cfg)
    if seed is not None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in comps.denoiser.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return family, comps


def _deltas(denoiser, alpha: float, rank: int) -> dict[str, object]:
    """Each adapted module's update B @ A * alpha / rank: what the LoRA adds."""
    params = dict(denoiser.named_parameters())
    out = {}
    for name, a in params.items():
        if ".lora_A.default.weight" in name:
            b = params[name.replace("lora_A", "lora_B")]
            out[name.split(".lora_A")[0]] = (b.float().flatten(1) @ a.float().flatten(1)
                                             * alpha / rank)
    return out


@pytest.mark.parametrize("family_name", ["sd15", "sd3"])
def test_saved_lora_files_start_the_adapter_with_the_same_weights(tmp_path: Path,
                                                                  tiny_workspace: Path,
                                                                  family_name: str):
    import torch

    family, saved = _model(family_name, tiny_workspace, rank=4, alpha=8.0, seed=1)
    files = family.save_lora(saved, tmp_path / "lora")
    assert len(files) == 2, files  # the diffusers file and the kohya/ComfyUI one
    want = _deltas(saved.denoiser, 8.0, 4)
    for kind, path in files.items():
        # alpha 4 here, 8 in the file: B is rescaled so the update is the same
        _, fresh = _model(family_name, tiny_workspace, rank=4, alpha=4.0)
        assert all(d.abs().max() == 0 for d in _deltas(fresh.denoiser, 4.0, 4).values())
        assert load_init_lora(fresh.denoiser, path) == 0
        got = _deltas(fresh.denoiser, 4.0, 4)
        assert got.keys() == want.keys()
        for module in want:
            assert torch.allclose(got[module], want[module], atol=1e-6), (kind, module)


def test_other_targets_are_an_error_that_says_what_differs(tmp_path: Path,
                                                           tiny_workspace: Path):
    family, saved = _model("sd15", tiny_workspace, rank=4, alpha=4.0, seed=2)
    files = family.save_lora(saved, tmp_path / "lora")
    _, fresh = _model("sd15", tiny_workspace, rank=4, alpha=4.0, targets="all")
    with pytest.raises(InitLoraError, match=r"train.init_lora: .* module\(s\) of this run's "
                                            r"train.lora_targets are not in the file"):
        load_init_lora(fresh.denoiser, files["kohya"])


def test_rank_mismatch_is_an_error_at_check_naming_both_ranks(tmp_path: Path,
                                                              tiny_workspace: Path):
    from core.check import run_check

    family, saved = _model("sd15", tiny_workspace, rank=4, alpha=4.0, seed=3)
    files = family.save_lora(saved, tmp_path / "lora")
    cfg = small_config(tmp_path)
    cfg.train.lora_rank = 8
    for path in files.values():
        cfg.train.init_lora = str(path)
        found = [str(p) for p in run_check(cfg, tmp_path, estimate=False).problems
                 if p.where == "train.init_lora"]
        assert found == [f"error: train.init_lora: {path} has rank 4 but train.lora_rank "
                         "is 8; set train.lora_rank = 4"]
    cfg.train.lora_rank = 4
    assert not [p for p in run_check(cfg, tmp_path, estimate=False).problems
                if p.where == "train.init_lora"]
    cfg.train.init_lora = str(tmp_path / "missing.safetensors")
    found = [str(p) for p in run_check(cfg, tmp_path, estimate=False).problems
             if p.where == "train.init_lora"]
    assert len(found) == 1 and "is not a file" in found[0]


def test_a_run_from_init_lora_trains_on_from_its_weights(tmp_path: Path,
                                                          tiny_workspace: Path, capsys):
    import torch
    from safetensors.torch import load_file

    from core.config import save_config

    family, saved = _model("sd15", tiny_workspace, rank=4, alpha=4.0, seed=4)
    start = family.save_lora(saved, tmp_path / "start")["kohya"]
    cfg = small_config(tmp_path)
    cfg.train.lora_rank, cfg.train.init_lora = 4, str(start)
    # one step at a vanishing rate: what the run saves is what it started from
    cfg.train.max_steps, cfg.train.learning_rate, cfg.train.weight_decay = 1, 1e-12, 0.0
    cfg.train.eval_every, cfg.validation.every, cfg.validation.prompts = 100, 100, []
    cfg.launch.cpu = True
    save_config(cfg, tmp_path / "config.toml")
    assert train_in_process(tmp_path / "config.toml", tmp_path) == 0
    final = load_file(str(Path(cfg.output.dir) / "lora/lora_kohya.safetensors"))
    first = load_file(str(start))
    assert final.keys() == first.keys()
    assert any(first[k].abs().max() > 0 for k in first if "lora_up" in k)
    for key in first:
        assert torch.allclose(final[key], first[key], atol=1e-6), key
    assert f"started from LoRA {start}" in capsys.readouterr().out

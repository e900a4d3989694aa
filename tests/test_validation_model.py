"""validation.model (core/train/validation_model.py) on tiny SD1.5, in this process: a
second tiny checkpoint (built with another seed) with the run's LoRA draws other pictures
than the run's base at the same seed, the very pictures its own pipeline draws with the
LoRA file the run saves; the training denoiser is left as it was; a distilled
checkpoint's own steps and guidance; the check's refusals (another family, a missing
folder, a full fine-tune); a run whose validation.model is tiny:sd15 draws it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from core.config import ValidationConfig
from core.models.capabilities import ValidationSpec
from core.models.registry import get_family
from core.train.validation import encode_validation_prompts, generate_validation_images


@pytest.fixture(scope="module")
def trained(tiny_workspace: Path, tmp_path_factory: pytest.TempPathFactory):
    """(family, components with a rank-4 LoRA of random weights, the other checkpoint's
    folder): a LoRA that changes the picture, as a trained one does."""
    import torch

    from core.models.adapters import adapter_config
    from core.models.registry import get_family
    from core.models.tiny import materialize_tiny
    from core.models.tiny.materialize import build_tiny_folder

    family = get_family("sd15")
    comps = family.load(str(materialize_tiny("sd15", tiny_workspace)))
    comps.denoiser.requires_grad_(False)
    targets = family.lora_target_modules("attention")
    comps.denoiser.add_adapter(adapter_config("lora", 4, 4, targets))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in comps.denoiser.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    other = tmp_path_factory.mktemp("other") / "tiny-sd15-other"
    with torch.random.fork_rng(devices=[]):
        build_tiny_folder("sd15", other, seed=7)
    return family, comps, other


def _draw(family, comps, folder: Path, **keys: object) -> list[np.ndarray]:
    from PIL import Image

    cfg = ValidationConfig(**{"prompts": ["a red circle"], "steps": 2, "resolution": 64,
                              "seed": 0, **keys})
    texts = encode_validation_prompts(family, comps, cfg)
    paths = generate_validation_images(family, comps, cfg, folder, 1, "cpu", texts)
    return [np.asarray(Image.open(p), dtype=np.int16) for p in paths]


def _weights(module) -> dict[str, np.ndarray]:
    return {k: v.detach().clone().numpy() for k, v in module.state_dict().items()}


def test_another_checkpoint_with_the_runs_lora(trained, tmp_path: Path):
    family, comps, other = trained
    before = _weights(comps.denoiser)
    own = _draw(family, comps, tmp_path / "own")
    drawn = _draw(family, comps, tmp_path / "other", model=str(other))
    assert all(int(np.abs(a - b).max()) > 2 for a, b in zip(own, drawn, strict=True))
    after = _weights(comps.denoiser)  # the training denoiser is untouched
    assert before.keys() == after.keys()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    # The other model's own pipeline with the LoRA file the run writes: the same pixels
    # (the prompts encoded by the run's text encoders, as validation encodes them).
    files = family.save_lora(comps, tmp_path / "lora")
    reference = family.load(str(other))
    family.validation_pipeline(reference).load_lora_weights(str(files["diffusers"]))
    with_run_text = dataclasses.replace(reference, text_encoders=comps.text_encoders,
                                        tokenizers=comps.tokenizers)
    direct = _draw(family, with_run_text, tmp_path / "direct")
    assert all(np.array_equal(a, b) for a, b in zip(direct, drawn, strict=True))


def test_a_distilled_checkpoint_samples_with_its_own_steps_and_guidance():
    from core.models.base import Components
    from core.models.families.flux2.family import Flux2Components
    from core.train.validation_model import sampling_settings

    def comps(source: str, distilled: bool = False) -> Components:
        """A model named `source`; `distilled`: one whose Components say is_distilled
        (FLUX.2's)."""
        if distilled:
            return Flux2Components("flux2", source, "", None, None, [], [], None,
                                   is_distilled=True)
        return Components("z_image", source, "", None, None, [], [], None)

    turbo = sampling_settings(ValidationConfig(), "z_image", comps("Tongyi-MAI/Z-Image-Turbo"))
    assert (turbo.steps, turbo.guidance_scale) == (9, 0.0)
    klein = sampling_settings(ValidationConfig(), "flux2", comps("/m/klein", distilled=True))
    assert (klein.steps, klein.guidance_scale) == (4, 1.0)
    krea = sampling_settings(ValidationConfig(), "krea2", comps("/models/Krea-2-Turbo"))
    assert (krea.steps, krea.guidance_scale) == (8, 0.0)
    ernie = sampling_settings(ValidationConfig(), "ernie_image", comps("baidu/ERNIE-Image-Turbo"))
    assert (ernie.steps, ernie.guidance_scale) == (8, 1.0)
    # Set by hand: kept; not distilled, or a family declaring none: unchanged.
    mine = sampling_settings(ValidationConfig(steps=12, guidance_scale=2.0), "z_image",
                             comps("x/Z-Image-Turbo"))
    assert (mine.steps, mine.guidance_scale) == (12, 2.0)
    plain = sampling_settings(ValidationConfig(), "z_image", comps("Tongyi-MAI/Z-Image"))
    assert (plain.steps, plain.guidance_scale) == (20, 5.0)
    assert sampling_settings(ValidationConfig(), "sd15", comps("a/turbo", True)).steps == 20


def test_a_distilled_validation_model_draws_with_its_own_settings(trained, tmp_path: Path,
                                                                  monkeypatch):
    """Through validation: a 'turbo' checkpoint of a family declaring validation.distilled
    draws with its steps and guidance where validation.steps and guidance_scale are defaults."""

    family, comps, other = trained
    monkeypatch.setattr(get_family("sd15"), "validation", ValidationSpec(distilled=(3, 1.0)))
    turbo = tmp_path / "tiny-sd15-turbo"
    turbo.symlink_to(other, target_is_directory=True)
    defaults = ValidationConfig()
    drawn = _draw(family, comps, tmp_path / "a", model=str(turbo), steps=defaults.steps)
    by_hand = _draw(family, comps, tmp_path / "b", model=str(other), steps=3,
                    guidance_scale=1.0)
    assert all(np.array_equal(a, b) for a, b in zip(drawn, by_hand, strict=True))


def _check(tmp_path: Path, tiny_workspace: Path, model: str, **train: object) -> list:
    from conftest import small_config

    from core.check import run_check

    cfg = small_config(tmp_path)
    cfg.validation.model = model
    for key, value in train.items():
        setattr(cfg.train, key, value)
    report = run_check(cfg, tiny_workspace, estimate=False)
    return [p for p in report.problems if p.where == "validation.model"]


def test_the_check_reads_validation_model_like_model_path(tmp_path: Path,
                                                          tiny_workspace: Path, trained):
    from conftest import small_config

    assert _check(tmp_path, tiny_workspace, "") == []
    assert _check(tmp_path, tiny_workspace, "tiny:sd15") == []
    assert _check(tmp_path, tiny_workspace, str(trained[2])) == []
    other_family = _check(tmp_path, tiny_workspace, "tiny:flux")
    assert other_family and "tiny:flux" in other_family[0].message
    assert other_family[0].level == "error"
    missing = _check(tmp_path, tiny_workspace, str(tmp_path / "no-such-model"))
    assert missing and "no-such-model" in missing[0].message
    assert "validation.model" in missing[0].message
    full = _check(tmp_path, tiny_workspace, "tiny:sd15", method="full")
    assert full and "train.method" in full[0].message
    from core.check import run_check

    cfg = small_config(tmp_path)
    cfg.validation.model, cfg.launch.distributed = "tiny:sd15", "fsdp"
    sharded = [p for p in run_check(cfg, tiny_workspace, estimate=False).problems
               if p.where == "validation.model"]
    assert sharded and "fsdp" in sharded[0].message


def test_a_run_validates_on_a_tiny_validation_model(tmp_path: Path, tiny_workspace: Path):
    """The trainer builds a tiny: validation.model in the workspace and draws with it."""
    from conftest import small_config, train_in_process

    from core.config import save_config

    cfg = small_config(tmp_path, images=2)
    cfg.train.max_steps, cfg.train.eval_every, cfg.launch.cpu = 1, 100, True
    cfg.validation.every, cfg.validation.steps, cfg.validation.resolution = 1, 2, 64
    cfg.validation.prompts, cfg.validation.model = ["a red circle"], "tiny:sd15"
    save_config(cfg, tmp_path / "config.toml")
    assert train_in_process(tmp_path / "config.toml", tiny_workspace) == 0
    assert list(Path(cfg.output.dir).glob("validation/step_000001/00.png"))


def test_the_estimates_validation_phase_adds_the_validation_model() -> None:
    """The other checkpoint's denoiser (sized as the trained one's) and the run's LoRA."""
    from conftest import REPO

    from core.config import apply_overrides, load_config, resolved
    from core.memory.estimate import estimate_memory
    from core.presets import preset_path

    def validation(*overrides: str) -> dict[str, int]:
        cfg = apply_overrides(load_config(preset_path("chroma-lora")),
                              ["model.path=random:chroma", *overrides])
        estimate = estimate_memory(resolved(cfg, REPO), REPO, caches_built=True)
        assert estimate is not None
        return {p.name: p.bytes for p in estimate.validation}

    own, other = validation(), validation("validation.model=random:chroma")
    assert "validation.model" not in own
    assert other["validation.model"] == other["frozen weights"] + other["trainable"]
    assert sum(other.values()) == sum(own.values()) + other["validation.model"]


def test_wan22s_two_experts_each_get_their_trained_adapter(tiny_workspace: Path) -> None:
    """validation.model of a two-expert Wan 2.2: each expert gets its namesake's LoRA."""
    import torch
    from peft.utils import get_peft_model_state_dict

    from core.config import Config
    from core.models.adapters import adapter_config
    from core.models.registry import get_family
    from core.models.tiny import resolve_model_path
    from core.train.validation_model import validation_model

    wan = get_family("wan")
    folder = resolve_model_path("tiny:wan22", tiny_workspace)
    comps = wan.load(folder)
    run = Config()
    run.model.family, run.model.path = "wan", folder
    wan.configure_run(comps, run)
    comps.denoiser.requires_grad_(False)
    comps.denoiser.add_adapter(adapter_config("lora", 4, 4, wan.lora_target_modules(
        "attention")))
    with torch.no_grad():
        for name, param in comps.denoiser.named_parameters():
            if "lora_" in name:
                param.normal_()
    cfg = ValidationConfig(model=folder)
    with validation_model(wan, comps, cfg, "cpu") as (drawn, _):
        assert drawn.denoiser is not comps.denoiser
        trained, others = comps.denoiser.experts(), drawn.denoiser.experts()
        assert len(trained) == 2
        for name, expert in trained.items():
            want = get_peft_model_state_dict(expert)
            got = get_peft_model_state_dict(others[name])
            assert want.keys() == got.keys() and want
            assert all(torch.equal(want[k], got[k]) for k in want)


def test_the_check_warns_of_settings_that_hide_a_distilled_checkpoints_own(
        tmp_path: Path, tiny_workspace: Path, trained, monkeypatch) -> None:
    from conftest import small_config

    from core.check import run_check

    monkeypatch.setattr(get_family("sd15"), "validation", ValidationSpec(distilled=(3, 1.0)))
    turbo = tmp_path / "tiny-sd15-turbo"
    turbo.symlink_to(trained[2], target_is_directory=True)

    def warned(**keys: object) -> set[str]:
        cfg = small_config(tmp_path)
        cfg.validation.model = str(turbo)
        for key, value in keys.items():
            setattr(cfg.validation, key, value)
        return {p.where for p in run_check(cfg, tiny_workspace, estimate=False).problems
                if p.level == "warning" and p.where.startswith("validation.")}

    assert warned(steps=20, guidance_scale=5.0) == set()  # the defaults: its own settings
    assert warned(steps=3, guidance_scale=1.0) == set()
    assert warned(steps=28, guidance_scale=4.0) == {"validation.steps",
                                                    "validation.guidance_scale"}

"""The flow-matching objective's keys (train.timestep_sampling, logit_mean, logit_std,
mode_scale, flow_shift, loss_weighting, guidance): drawn as diffusers' training_utils
draws, resolved against each family's own defaults ("auto" changes nothing), refused by
the check on epsilon/v families, and reaching the training loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from core.config import Config, validate_config
from core.models.objectives import FlowTraining, loss_weights, sample_sigmas, timestep_density
from core.models.registry import FLOW_FAMILIES, get_family
from core.models.tiny import resolve_model_path
from core.train.setup import apply_objective
from tests.conftest import step_losses

QUANTILES = torch.linspace(0.05, 0.95, 19)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(("scheme", "mean", "std", "scale"), [
    ("logit_normal", 0.0, 1.0, 1.29), ("logit_normal", 0.7, 1.4, 1.29),
    ("mode", 0.0, 1.0, 1.29), ("mode", 0.0, 1.0, -0.5), ("uniform", 0.0, 1.0, 1.29)])
def test_density_is_diffusers_compute_density_for_timestep_sampling(
        scheme: str, mean: float, std: float, scale: float) -> None:
    from diffusers.training_utils import compute_density_for_timestep_sampling

    theirs = compute_density_for_timestep_sampling(
        weighting_scheme={"uniform": "none"}.get(scheme, scheme), batch_size=4096,
        logit_mean=mean, logit_std=std, mode_scale=scale, generator=gen(5))
    ours = timestep_density(4096, gen(5), "cpu", scheme, mean, std, scale)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("scheme", ["sigma_sqrt", "cosmap", "none"])
def test_loss_weights_are_diffusers_compute_loss_weighting_for_sd3(scheme: str) -> None:
    from diffusers.training_utils import compute_loss_weighting_for_sd3

    sigmas = torch.linspace(0.01, 0.99, 50)
    theirs = compute_loss_weighting_for_sd3(weighting_scheme=scheme, sigmas=sigmas)
    ours = loss_weights(sigmas, scheme)
    torch.testing.assert_close(torch.ones(50) if ours is None else ours, theirs)


def test_sigmoid_is_never_shifted_and_logit_normal_is() -> None:
    plain = sample_sigmas(8, gen(1), "cpu", "sigmoid", 0.3, 1.2, shift=3.0)
    lognorm = sample_sigmas(8, gen(1), "cpu", "logit_normal", 0.3, 1.2, shift=3.0)
    torch.testing.assert_close(plain, sample_sigmas(8, gen(1), "cpu", "logit_normal",
                                                    0.3, 1.2, shift=1.0))
    assert (lognorm > plain).all()


# ---------------------------------------------------------------- the families


@pytest.fixture(scope="module")
def loaded(tiny_workspace: Path) -> Any:
    cache: dict[str, Any] = {}

    def load(family: str) -> Any:
        if family not in cache:
            path = str(resolve_model_path(f"tiny:{family}", tiny_workspace))
            cache[family] = get_family(family).load(path)
        return cache[family]

    return load


def _cfg(family: str, **train: Any) -> Config:
    cfg = Config()
    cfg.model.family, cfg.model.path = family, f"tiny:{family}"
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def _draw(family: str, c: Any, n: int = 64, seed: int = 3) -> Any:
    return get_family(family).noise_and_target(c, torch.zeros(n, 1, 1, 1), generator=gen(seed))


@pytest.mark.parametrize("family", FLOW_FAMILIES)
def test_auto_keeps_each_familys_own_draws_exactly(loaded: Any, family: str) -> None:
    """A config with every new key at its default trains exactly as before the keys
    existed: the same sigmas and weights, bit for bit."""
    c = loaded(family)
    c.flow = None
    before = _draw(family, c)
    apply_objective(get_family(family), c, _cfg(family))
    try:
        after = _draw(family, c)
    finally:
        c.flow = None
    assert torch.equal(before.timesteps, after.timesteps)
    assert before.weights is None and after.weights is None


def test_family_defaults_are_pinned(loaded: Any) -> None:
    """What "auto" means per family. Flux and FLUX.2 keep logit-normal where diffusers'
    scripts default to uniform (the SD3 paper's finding, kohya/SimpleTuner/ai-toolkit's
    default, and every earlier run; see core/models/families/flux/family.py)."""
    want = {"sd3": ("logit_normal", 3.0), "flux": ("logit_normal", 1.0),
            "flux2": ("logit_normal", 1.0), "chroma": ("logit_normal", 1.0),
            "z_image": ("uniform", None), "qwen_image": ("uniform", 1.0)}
    for family, (sampling, shift) in want.items():
        c = loaded(family)
        s = get_family(family).flow_settings(c)
        assert s.timestep_sampling == sampling, family
        if shift is not None:
            assert s.shift == shift, family
        assert s.loss_weighting == "none" and (s.logit_mean, s.logit_std) == (0.0, 1.0)


@pytest.mark.parametrize("family", ["sd3", "flux", "qwen_image"])
def test_run_choices_change_the_draws(loaded: Any, family: str) -> None:
    """uniform at shift 1 draws the uniform law; flow_shift 3 moves the median to 0.75;
    mode and cosmap are what the run asked for."""
    c = loaded(family)
    try:
        c.flow = FlowTraining(timestep_sampling="uniform", shift=1.0)
        sig = _draw(family, c, 20000).timesteps / 1000
        torch.testing.assert_close(torch.quantile(sig, QUANTILES), QUANTILES, rtol=0, atol=0.02)
        c.flow = FlowTraining(timestep_sampling="uniform", shift=3.0)
        sig = _draw(family, c, 20000).timesteps / 1000
        assert abs(float(sig.median()) - 0.75) < 0.02
        c.flow = FlowTraining(timestep_sampling="mode", mode_scale=1.29, shift=1.0,
                              loss_weighting="cosmap")
        sample = _draw(family, c, 20000)
        sig = sample.timesteps / 1000
        mode = timestep_density(20000, gen(9), "cpu", "mode", mode_scale=1.29)
        torch.testing.assert_close(torch.quantile(sig, QUANTILES),
                                   torch.quantile(mode, QUANTILES), rtol=0, atol=0.02)
        torch.testing.assert_close(sample.weights, loss_weights(sig, "cosmap"))
    finally:
        c.flow = None


def test_training_guidance_reaches_flux_and_is_refused_without_an_embedding(
        loaded: Any) -> None:
    from core.train.setup import TrainingError

    c = loaded("flux")
    apply_objective(get_family("flux"), c, _cfg("flux", guidance=3.5))
    assert c.guidance == 3.5
    c.guidance, c.flow = 1.0, None
    klein = loaded("flux2")  # the tiny FLUX.2 is klein-shaped: no guidance embedding
    with pytest.raises(TrainingError, match="train.guidance"):
        apply_objective(get_family("flux2"), klein, _cfg("flux2", guidance=3.5))
    klein.flow = None


# ---------------------------------------------------------------- the check


@pytest.mark.parametrize(("key", "value"), [
    ("timestep_sampling", "mode"), ("logit_mean", 0.5), ("logit_std", 2.0),
    ("mode_scale", 0.5), ("flow_shift", 3.0), ("loss_weighting", "cosmap"),
    ("guidance", 3.5)])
def test_check_refuses_flow_keys_on_epsilon_families_naming_the_key(key: str,
                                                                    value: Any) -> None:
    problems = [p for p in validate_config(_cfg("sdxl", **{key: value}))
                if p.where == f"train.{key}"]
    assert len(problems) == 1 and problems[0].level == "error"
    on_sd3 = [p for p in validate_config(_cfg("sd3", **{key: value}))
              if p.where == f"train.{key}" and p.level == "error"]
    assert len(on_sd3) == (key == "guidance")  # sd3 has no guidance-distilled model
    assert not [p for p in validate_config(_cfg("flux", **{key: value}))
                if p.where == f"train.{key}" and p.level == "error"]


def test_check_warns_about_keys_the_sampling_ignores() -> None:
    cfg = _cfg("flux", timestep_sampling="sigmoid", flow_shift=3.0, mode_scale=0.5)
    warned = {p.where for p in validate_config(cfg) if p.level == "warning"}
    assert {"train.flow_shift", "train.mode_scale"} <= warned


# ---------------------------------------------------------------- the training loop


@pytest.mark.slow
def test_the_keys_reach_the_training_loop(tmp_path: Path, tiny_workspace: Path) -> None:
    """sd3: the family's own sampling spelled out trains exactly as auto; mode sampling,
    a shift and a weighting each change the first step's loss. flux: guidance 3.5 too."""
    base = step_losses(tmp_path / "auto", 2, "sd3")
    assert step_losses(tmp_path / "spelled", 2, "sd3", timestep_sampling="logit_normal",
                       flow_shift=3.0, loss_weighting="none") == base
    for name, train in {"mode": {"timestep_sampling": "mode"}, "shift": {"flow_shift": 1.0},
                        "cosmap": {"loss_weighting": "cosmap"}}.items():
        assert step_losses(tmp_path / name, 2, "sd3", **train)[0] != base[0], name
    flux = step_losses(tmp_path / "flux", 2, "flux")
    assert step_losses(tmp_path / "flux35", 2, "flux", guidance=3.5)[0] != flux[0]

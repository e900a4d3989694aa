"""Single-file checkpoints as people download them: the tiny SD1.5, SD2 and SDXL folders
written in the original (LDM) layout as fp16 .safetensors (tests/ldm_checkpoint.py),
loaded through model.path = <file> and model.config = <the folder>. Offline throughout
(conftest sets HF_HUB_OFFLINE)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import PYTHON, REPO, check_in_process, write_shapes
from ldm_checkpoint import build_sdxl_with_distinct_encoders, write_single_file

from core.check import run_check
from core.config import Config, DatasetConfig, save_config
from core.models import loading
from core.models.registry import FAMILY_NAMES, FLOW_FAMILIES, get_family
from core.models.tiny import resolve_model_path

FAMILIES = ("sd15", "sd2", "sdxl")


@pytest.fixture(scope="module")
def models(tiny_workspace: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, tuple[Path, Path]]:
    """family -> (diffusers folder, the same model as one original-layout file). SDXL's
    folder has encoders of different widths, as the real model (see ldm_checkpoint)."""
    out = tmp_path_factory.mktemp("single-files")
    folders = {f: Path(resolve_model_path(f"tiny:{f}", tiny_workspace)) for f in ("sd15", "sd2")}
    folders["sdxl"] = build_sdxl_with_distinct_encoders(out / "sdxl-distinct")
    return {f: (folder, write_single_file(folder, f, out / f"{f}.safetensors"))
            for f, folder in folders.items()}


def _modules(c: object) -> dict[str, torch.nn.Module]:
    return {"vae": c.vae, "denoiser": c.denoiser,
            **{f"text_encoder_{i}": m for i, m in enumerate(c.text_encoders)}}


@pytest.mark.parametrize("family", FAMILIES)
def test_single_file_loads_the_folders_weights_through_model_config(family, models) -> None:
    folder, file = models[family]
    header = loading.safetensors_header(str(file))
    assert {v["dtype"] for v in header.values()} == {"F16"}, "stored as checkpoints ship"
    assert loading.detect_checkpoint_family(list(header)) == family
    fam = get_family(family)
    reference, c = fam.load(str(folder)), fam.load(str(file), config=str(folder))
    assert c.source == str(file)
    for name, module in _modules(c).items():
        expected = _modules(reference)[name].state_dict()
        got = module.state_dict()
        assert got.keys() == expected.keys(), name
        for key, value in expected.items():
            assert torch.equal(got[key].float(), value.half().float()), f"{name}: {key}"


def test_a_file_whose_configs_leave_an_encoder_empty_is_refused(tiny_workspace, tmp_path):
    """The plain tiny SDXL has two 32-wide text encoders; diffusers tells SDXL's encoders
    apart by width, finds no weights for text_encoder_2 and leaves it empty (meta): the
    load must say so instead of failing later on a tensor with no data."""
    folder = Path(resolve_model_path("tiny:sdxl", tiny_workspace))
    file = write_single_file(folder, "sdxl", tmp_path / "equal-widths.safetensors")
    with pytest.raises(loading.ModelLoadError) as info:
        get_family("sdxl").load(str(file), config=str(folder))
    message = str(info.value)
    assert str(file) in message and "text_encoder_2 found no weights" in message
    assert "model.config" in message


# ---------------------------------------------------------------- prediction type


def _load_model(family: str, models, workspace: Path, prediction_type: str):
    from accelerate import PartialState

    from core.startup import load_model

    folder, file = models[family]
    cfg = Config()
    cfg.model.family, cfg.model.path, cfg.model.config = family, str(file), str(folder)
    cfg.model.prediction_type = prediction_type
    return load_model(cfg, workspace, PartialState(cpu=True), device="cpu")


@pytest.mark.parametrize(("family", "prediction_type", "expected"), [
    ("sd2", "auto", "v_prediction"),  # the tiny SD2 folder's scheduler says v (SD2-768)
    ("sd2", "epsilon", "epsilon"),  # an SD2-base file
    ("sd15", "v_prediction", "v_prediction"),  # a v-prediction SD1.5 fine-tune
    ("sdxl", "v_prediction", "v_prediction"),
    ("sdxl", "auto", "epsilon"),
])
def test_prediction_type_sets_the_training_and_validation_target(
        family, prediction_type, expected, models, tiny_workspace) -> None:
    fam, c = _load_model(family, models, tiny_workspace, prediction_type)
    g = torch.Generator().manual_seed(0)
    latents, noise = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 4, 8, 8, generator=g)
    t = torch.tensor([500, 900])
    sample = fam.noise_and_target(c, latents, timesteps=t, noise=noise)
    velocity = c.noise_scheduler.get_velocity(latents, noise, t)
    if expected == "epsilon":
        assert torch.equal(sample.target, noise)
    else:
        assert torch.allclose(sample.target, velocity) and not torch.allclose(sample.target, noise)
    pipe = fam.validation_pipeline(c)
    assert pipe.scheduler.config.prediction_type == expected, "validation samples the same"


def test_flow_families_are_the_flow_matching_ones() -> None:
    for name in FAMILY_NAMES:
        assert (get_family(name).prediction == "flow_matching") == (name in FLOW_FAMILIES), name


# ---------------------------------------------------------------- --stage check


def _config(workspace: Path, file: Path, config: str = "", family: str = "sd15") -> Config:
    write_shapes(workspace / "data/a", 2)
    cfg = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a",
                                         resolution=64)])
    cfg.model.family, cfg.model.path, cfg.model.config = family, str(file), config
    cfg.output.dir = "runs/single-file"
    return cfg


def _model_problems(cfg: Config, workspace: Path) -> list[str]:
    report = run_check(cfg, workspace, estimate=False)
    return [str(p) for p in report.problems if p.where.startswith("model.")]


def test_check_reads_model_config_against_the_workspace_and_names_its_problems(
        models, tiny_workspace, tmp_path) -> None:
    folder, file = models["sd15"]
    relative = str(folder.relative_to(tiny_workspace))  # models/tiny-sd15
    assert _model_problems(_config(tiny_workspace, file, relative), tiny_workspace) == []
    sdxl_folder = models["sdxl"][0]
    [p] = _model_problems(_config(tmp_path, file, str(sdxl_folder)), tmp_path)
    assert p.startswith("error: model.config:") and "StableDiffusionXLPipeline" in p
    (tmp_path / "not-diffusers").mkdir()
    [p] = _model_problems(_config(tmp_path, file, str(tmp_path / "not-diffusers")), tmp_path)
    assert p.startswith("error: model.config:") and "no model_index.json" in p
    [p] = _model_problems(_config(tmp_path, file, "models/typo"), tmp_path)
    assert p.startswith("error: model.config: models/typo is neither a folder")
    [p] = _model_problems(_config(tmp_path, file, "tiny:sd2"), tmp_path)
    assert p.startswith("error: model.config:") and "use tiny:sd15" in p
    cfg = _config(tmp_path, folder, str(folder))
    [p] = _model_problems(cfg, tmp_path)
    assert p.startswith("warning: model.config:") and "ignored" in p


def test_sd2_file_with_default_configs_warns_about_v_prediction(models, tmp_path,
                                                                monkeypatch) -> None:
    """Online, diffusers reads an SD2 file with SD2-768's configs (v_prediction): the
    check says how an SD2-base file trains on epsilon instead."""
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=3.0: True)
    file = models["sd2"][1]
    [p] = _model_problems(_config(tmp_path, file, family="sd2"), tmp_path)
    assert p.startswith("warning: model.prediction_type:")
    assert 'model.prediction_type = "epsilon"' in p
    cfg = _config(tmp_path, file, family="sd2")
    cfg.model.prediction_type = "epsilon"
    assert _model_problems(cfg, tmp_path) == []


def test_offline_single_file_without_model_config_exits_2_at_check(models, tmp_path) -> None:
    file = models["sd15"][1]
    save_config(_config(tmp_path, file), tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"), "--workspace",
                            str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = [x for x in done.stdout.splitlines() if x.startswith("error:")]
    assert line.startswith("error: model.config: is empty") and str(file) in line
    assert "no network" in line and "stable-diffusion-v1-5/stable-diffusion-v1-5" in line
    assert "set model.config to a diffusers folder" in line


# ---------------------------------------------------------------- end to end


def _app(workspace: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(REPO / "app.py"), "--no-ui", "--workspace",
                           str(workspace), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def _image(pipe: object) -> torch.Tensor:
    out = pipe("a red circle", num_inference_steps=2, height=64, width=64, output_type="np",
               generator=torch.Generator().manual_seed(0))
    return torch.from_numpy(out.images[0])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["sd15", "sdxl"])
def test_single_file_checks_caches_trains_and_its_lora_reloads(family, models, tmp_path):
    """The whole flow a user of a downloaded checkpoint goes through, offline: the file
    and its configs in the workspace, named relatively; check, cache and train in one run; then the
    LoRA loads with diffusers' load_lora_weights onto the single file and changes it."""
    folder, file = models[family]
    shutil.copytree(folder, tmp_path / "models/configs")
    shutil.copy(file, tmp_path / "models/model.safetensors")
    cfg = _config(tmp_path, Path("models/model.safetensors"), "models/configs", family)
    cfg.datasets[0].images = "data/a"
    write_shapes(tmp_path / "data/a", 4)
    cfg.train.max_steps, cfg.train.batch_size, cfg.train.learning_rate = 2, 2, 1e-3
    cfg.train.eval_every, cfg.train.eval_images = 2, 2
    cfg.validation.every, cfg.validation.steps, cfg.validation.resolution = 2, 2, 64
    save_config(cfg, tmp_path / "run.toml")
    # One process, as a user runs it: the check, then the cache build, then training
    # (the cache stage alone and its reuse are test_cache's).
    done = _app(tmp_path, "--config", str(tmp_path / "run.toml"))
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "summary: 0 error(s), 0 warning(s)" in done.stdout
    assert "4 image(s), 4 to build" in done.stdout
    run = tmp_path / "runs/single-file"
    assert (run / "validation/step_000002/00.png").is_file()

    fam = get_family(family)
    pipe = fam.validation_pipeline(fam.load(str(file), config=str(folder)))
    before = _image(pipe)
    pipe.load_lora_weights(str(run / "lora"))
    assert (_image(pipe) - before).abs().max() > 1e-4

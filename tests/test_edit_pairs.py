"""Paired datasets for edit models (issue 24), end to end on tiny FLUX.1 Kontext: control
images matched to targets by file stem (another extension and size are fine), a target
without its control and a control without a target named at check and left out, the
folder conflicts and wrong keys refused naming the key, control latents cached in the
target's entry (stale when the control changes), and a run whose validation edits its
control images, with grid.png showing control | before | after."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import check_in_process, small_config, train_in_process

from core.config import save_config


def paired_config(tmp_path: Path, family: str = "flux_kontext"):
    """Six targets (64x64 PNG); controls for the first five as 80x48 JPEGs, plus one
    control whose target does not exist."""
    from PIL import Image

    cfg = small_config(tmp_path, images=6, family=family)
    control = tmp_path / "control"
    control.mkdir()
    for i in range(5):
        Image.new("RGB", (80, 48), (40 * i, 90, 200)).save(control / f"img_{i:03d}.jpg")
    Image.new("RGB", (64, 64), "white").save(control / "orphan.png")
    cfg.datasets[0].control = str(control)
    cfg.validation.prompts = ["make it red"]
    cfg.validation.control_images = [str(control / "img_000.jpg")]
    return cfg


def check(cfg, tmp_path: Path):
    """--stage check of `cfg` written with every key (a saved config of a family that is
    not an edit model leaves the control keys out, as a user's hand-written one may not)."""
    import tomli_w

    from core.config.files import config_to_dict

    (tmp_path / "run.toml").write_text(tomli_w.dumps(config_to_dict(cfg)), encoding="utf-8")
    return check_in_process("--config", str(tmp_path / "run.toml"))


def test_check_names_unpaired_files_and_leaves_them_out(tmp_path: Path) -> None:
    done = check(paired_config(tmp_path), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "dataset 'd0': 5 image(s), each paired with 1 control image" in out
    assert "warning: datasets.0.control: no control image for" in out
    assert "img_005.png" in out and "it is left out of training" in out
    assert "orphan.png has no target image" in out


def test_controls_match_by_relative_path_not_by_stem(tmp_path: Path) -> None:
    """a/x.png and b/x.png share a stem: each pairs with the control in its own subfolder
    (the cache plan, no model)."""
    from PIL import Image

    from core.cache.plan import plan_caches

    cfg = small_config(tmp_path, images=1, family="flux_kontext")
    for folder in ("data0", "control0"):
        for p in (tmp_path / folder).iterdir():
            p.unlink()
    for sub, color in (("a", "red"), ("b", "blue")):
        for folder in ("data0", "control0"):
            (tmp_path / folder / sub).mkdir()
            Image.new("RGB", (64, 64), color).save(tmp_path / folder / sub / "x.png")
        (tmp_path / "data0" / sub / "x.txt").write_text(f"a {color} picture")
    plan = plan_caches(cfg, {"family": "flux_kontext", "model": "tiny"})
    pairs = {job.image.relative_to(tmp_path / "data0").as_posix():
             [c.relative_to(tmp_path / "control0").as_posix() for c in job.controls]
             for job in plan.vae_jobs}
    assert pairs == {"a/x.png": ["a/x.png"], "b/x.png": ["b/x.png"]}, pairs
    assert not [p for p in plan.problems if "control" in p.message], plan.problems


@pytest.mark.parametrize(("where", "message"), [
    ("images", "is the same folder as dataset 'd0' images"),
    ("inside_images", "is inside dataset 'd0' images"),
    ("cache", "is inside dataset 'd0' vae_cache"),
])
def test_a_control_folder_that_mixes_with_images_or_caches_is_refused(
        tmp_path: Path, where: str, message: str) -> None:
    cfg = paired_config(tmp_path)
    ds = cfg.datasets[0]
    ds.control = {"images": ds.images, "inside_images": str(Path(ds.images) / "sub"),
                  "cache": str(Path(ds.vae_cache) / "control")}[where]
    Path(ds.control).mkdir(parents=True, exist_ok=True)
    done = check(cfg, tmp_path)
    assert done.returncode == 2
    assert "error: datasets.0.control: dataset 'd0' control" in done.stdout
    assert message in done.stdout


@pytest.mark.parametrize(("family", "change", "key", "message"), [
    ("sd15", {}, "datasets.0.control", "is set, but model.family = 'sd15' is not an edit "
                                       "model; clear it, or choose an edit family"),
    ("flux_kontext", {"control": ""}, "datasets.0.control", "is empty, but model.family = "
                                                            "'flux_kontext' trains edits"),
    ("flux_kontext", {"control_2": "x"}, "datasets.0.control_2",
     "flux_kontext takes 1 control image(s) per target"),
    ("flux_kontext", {"validation": []}, "validation.control_images",
     "has 0 entries for 1 validation prompt(s)"),
])
def test_control_keys_the_family_cannot_take_are_refused(
        tmp_path: Path, family: str, change: dict, key: str, message: str) -> None:
    cfg = paired_config(tmp_path, family)
    for name, value in change.items():
        if name == "validation":
            cfg.validation.control_images = value
        else:
            setattr(cfg.datasets[0], name, value)
    done = check(cfg, tmp_path)
    assert done.returncode == 2
    assert f"error: {key}: {message}" in done.stdout


@pytest.mark.parametrize(("family", "model", "references"), [
    ("flux_kontext", "tiny:flux_kontext", 1),
    ("qwen_image_edit", "tiny:qwen_image_edit", 1),
    ("qwen_image_edit", "tiny:qwen_image_edit_plus", 2),
])
def test_pairs_cache_train_and_validation_edits_the_control(
        tmp_path: Path, tiny_workspace: Path, family: str, model: str, references: int) -> None:

    from PIL import Image
    from safetensors import safe_open

    from core.cache.build import stale
    from core.cache.plan import plan_caches

    cfg = paired_config(tmp_path, family)
    cfg.model.path = model
    if references == 2:  # a Plus model's second reference
        second_control(cfg, tmp_path)
    cache = train_pairs(cfg, tmp_path, tiny_workspace)
    with safe_open(str(cache / "img_000.png.safetensors"), "pt") as fh:
        assert fh.get_slice("control_latents").get_shape() == [references, 16, 8, 8]
        assert fh.metadata()["control0_source"].endswith("control/img_000.jpg")
    assert not (cache / "img_005.png.safetensors").exists(), "no control: left out"
    if family == "qwen_image_edit":  # the text encoder read the control with the caption
        texts = list(Path(cfg.text_cache.dir).rglob("*.safetensors"))
        with safe_open(str(texts[0]), "pt") as fh:
            assert "control0_source" in fh.metadata()
    run = Path(cfg.output.dir)
    assert (run / "validation/step_000002/00.png").is_file()
    grid = Image.open(run / "validation/grid.png")
    cell = references * 80 * 64 // 48  # the widest picture: the controls side by side
    assert grid.size == (150 + 3 * cell, 16 + 64), "control | before | after"
    # The control column shows the control image (its blue), not a drawn one.
    assert grid.getpixel((150 + cell // 2, 16 + 32)) == (0, 90, 200)

    # A changed control image makes its target's entry stale, and only that one.
    Image.new("RGB", (80, 48), "black").save(Path(cfg.datasets[0].control) / "img_001.jpg")
    plan = plan_caches(cfg, _identity(cache / "img_000.png.safetensors"))
    assert [job.image.name for job in stale(plan.vae_jobs)] == ["img_001.png"]


def second_control(cfg, tmp_path: Path) -> Path:
    """datasets.0.control_2: a copy of the control folder (the same pictures, matched as
    control is), its img_000 added to the first validation entry; the folder."""
    import shutil

    second = tmp_path / "control_2"
    shutil.copytree(cfg.datasets[0].control, second)
    cfg.datasets[0].control_2 = str(second)
    cfg.validation.control_images = [cfg.validation.control_images[0] + "|"
                                     + str(second / "img_000.jpg"),
                                     *cfg.validation.control_images[1:]]
    return second


def train_pairs(cfg, tmp_path: Path, workspace: Path) -> Path:
    """`cfg` trained 2 steps in-process, validated before training and at step 2; its
    first dataset's VAE cache folder."""
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 2, 2, 2
    cfg.validation.before_training = True
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", workspace) == 0
    return Path(cfg.datasets[0].vae_cache)


def _identity(entry: Path) -> dict[str, str]:
    """The model fields an entry was written with (so a plan made here matches it)."""
    from safetensors import safe_open

    with safe_open(str(entry), "pt") as fh:
        meta = fh.metadata()
    return {"family": meta["family"], "model": meta["model"]}

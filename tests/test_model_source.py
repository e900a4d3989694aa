"""model.path values that look like local paths: a typo says the folder is missing (and
names the close ones), not that a hub model is absent from the HF cache."""

from __future__ import annotations

from pathlib import Path

from core.config import Config, DatasetConfig
from core.models import loading
from core.models.loading import check_model_source, missing_local_path


def test_a_mistyped_local_folder_says_it_does_not_exist_and_names_the_close_one(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=3.0: False)
    (tmp_path / "models/tiny-sd15-shapes").mkdir(parents=True)
    (tmp_path / "models/tiny-sd15").mkdir()
    [p] = check_model_source("models/tiny-sd51", "sd15", workspace=tmp_path)
    assert p.where == "model.path"
    assert f"{tmp_path}/models/tiny-sd51 does not exist" in p.message
    assert "HF cache" not in p.message
    assert f"did you mean {tmp_path}/models/tiny-sd15" in p.message


def test_path_looking_values_and_hub_ids_are_told_apart(tmp_path: Path) -> None:
    assert "does not exist" in missing_local_path("./my-model", tmp_path)
    assert "does not exist" in missing_local_path("~/nowhere-xyz/model", tmp_path)
    assert "does not exist" in missing_local_path("a/b/c", tmp_path)
    assert "does not exist" in missing_local_path("/nowhere-xyz/model", tmp_path)
    # owner/name with no such folder here: a hub id, left to the hub checks
    assert missing_local_path("stabilityai/sdxl-turbo", tmp_path) is None
    assert missing_local_path("tiny:sd15", tmp_path) is None
    (tmp_path / "models/present").mkdir(parents=True)
    assert missing_local_path("models/present", tmp_path) is None


def test_the_check_stage_resolves_the_path_against_the_workspace(tmp_path: Path) -> None:
    from core.check import run_check

    (tmp_path / "models").mkdir()
    cfg = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a")])
    cfg.model.path = "models/tiny-sd51"
    report = run_check(cfg, tmp_path, estimate=False)
    [p] = [p for p in report.problems if p.where == "model.path"]
    assert "does not exist" in p.message and "HF cache" not in p.message


def test_model_path_is_classified_once_into_one_kind(tmp_path: Path) -> None:
    from core.models.source import model_source

    (tmp_path / "folder").mkdir()
    (tmp_path / "model.safetensors").write_bytes(b"")
    kinds = {text: model_source(text) for text in (
        "tiny:sd15-shapes", "random:flux", str(tmp_path / "folder"),
        str(tmp_path / "model.safetensors"), "black-forest-labs/FLUX.1-dev",
        "data/model.safetensors", "", str(tmp_path / "absent"))}
    assert [(s.kind, s.name) for s in kinds.values()] == [
        ("tiny", "sd15-shapes"), ("random", "flux"), ("folder", str(tmp_path / "folder")),
        ("file", str(tmp_path / "model.safetensors")),
        ("hub", "black-forest-labs/FLUX.1-dev"),
        ("missing", "data/model.safetensors"), ("missing", ""),
        ("missing", str(tmp_path / "absent"))]
    assert [s.built for s in kinds.values()][:3] == [True, True, False]


def test_only_the_source_module_reads_the_model_path_prefixes() -> None:
    """The kinds are decided in core/models/source.py: elsewhere in core/ and ui/, no
    `startswith("tiny:")`, `startswith(RANDOM_PREFIX)` or the like."""
    import re

    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"startswith\(\(?\s*(\"(tiny|random):|'(tiny|random):|"
                         r"TINY_PREFIX|RANDOM_PREFIX)")
    found = [f"{path.relative_to(root)}:{n}"
             for folder in ("core", "ui") for path in sorted((root / folder).rglob("*.py"))
             if path != root / "core/models/source.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if pattern.search(line)]
    assert found == [], found


def test_a_folder_names_the_pipeline_variant_it_loads_with(tmp_path: Path) -> None:
    """pipeline_class_or: the image-to-video class where model_index.json names it, the
    family's default for another folder and for what has no model_index.json to read."""
    import json

    from core.models.source import names_pipeline, pipeline_class_or

    i2v, t2v = tmp_path / "i2v", tmp_path / "t2v"
    for folder, name in ((i2v, "WanImageToVideoPipeline"), (t2v, "WanPipeline")):
        folder.mkdir()
        (folder / "model_index.json").write_text(json.dumps({"_class_name": name}))
    wanted = "WanImageToVideoPipeline"
    assert pipeline_class_or(str(i2v), wanted, "WanPipeline") == wanted
    assert pipeline_class_or(str(t2v), wanted, "WanPipeline") == "WanPipeline"
    assert pipeline_class_or("tiny:wan", wanted, "WanPipeline") == "WanPipeline"
    assert names_pipeline(str(i2v), wanted, "wan_i2v") and names_pipeline("tiny:wan_i2v",
                                                                          wanted, "wan_i2v")

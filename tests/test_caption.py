"""Auto-captioning (`--stage caption`) with a tiny random BLIP built offline.

End-to-end through `python app.py --no-ui`: the job runs under the run manager and
writes `.txt` sidecars; existing captions are never touched unless overwrite is on, and
then they are kept as `.txt.bak` first.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from core.config import Config, DatasetConfig, save_config
from tests.conftest import app_in_process, write_shapes

CAPTIONER = "models/tiny-blip"  # relative: resolved against the workspace


@pytest.fixture(scope="module")
def captioner_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from core.caption.tiny import build_tiny_blip

    return build_tiny_blip(tmp_path_factory.mktemp("blip") / "tiny-blip")


def workspace_with(tmp: Path, captioner: Path, images: int = 4) -> tuple[Path, list[Path]]:
    """A workspace with the captioner (a link) and a dataset of `images` images, each
    with a caption; the caller removes the captions it wants missing."""
    ws = tmp / "ws"
    (ws / "models").mkdir(parents=True)
    (ws / CAPTIONER).symlink_to(captioner, target_is_directory=True)
    paths = write_shapes(ws / "data/pics", images, size=(40, 48))
    return ws, paths


def config(ws: Path, **captioning: object) -> Path:
    cfg = Config()
    cfg.datasets.append(DatasetConfig(id="pics", images="data/pics",
                                      vae_cache="cache/pics", resolution=64))
    cfg.datasets.append(DatasetConfig(id="names", images="data/pics",
                                      vae_cache="cache/names", caption="filename",
                                      resolution=64))
    cfg.captioning.model = CAPTIONER
    cfg.captioning.datasets = ["pics"]
    cfg.captioning.batch_size = 2
    cfg.captioning.max_new_tokens = 4
    for key, value in captioning.items():
        setattr(cfg.captioning, key, value)
    path = ws / "caption.toml"
    save_config(cfg, path)
    return path


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The captioning jobs run as on a machine without a GPU."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def run_stage(ws: Path, cfg: Path, *sets: str) -> subprocess.CompletedProcess:
    """`app.py --stage caption`, in-process: its check here, the captioning job launched
    as a subprocess under the run manager as always."""
    args = ["--no-ui", "--workspace", str(ws), "--config", str(cfg), "--stage", "caption"]
    for item in sets:
        args += ["--set", item]
    return app_in_process(*args)


def caption_in_process(ws: Path, cfg: Path, capsys: pytest.CaptureFixture[str]
                       ) -> subprocess.CompletedProcess:
    """The captioning program (core/caption/main.py) run in this process: what it writes
    and prints, for the tests about its outcome; run_stage and the UI action's test run
    it as the subprocess the stage starts."""
    from core.caption.main import main

    capsys.readouterr()
    code = main(["--config", str(cfg), "--workspace", str(ws)])
    out = capsys.readouterr()
    return subprocess.CompletedProcess([], code, out.out, out.err)


@pytest.mark.slow
def test_caption_stage_fills_missing_captions_and_touches_no_existing_one(
        tmp_path: Path, captioner_dir: Path) -> None:
    ws, paths = workspace_with(tmp_path, captioner_dir)
    missing = [paths[0].with_suffix(".txt"), paths[2].with_suffix(".txt")]
    missing[0].unlink()
    missing[1].write_text("  \n", encoding="utf-8")  # empty counts as no caption
    kept = [paths[1].with_suffix(".txt"), paths[3].with_suffix(".txt")]
    past = time.time() - 3600  # an hour ago: any write would show in the mtime
    for txt in kept:
        os.utime(txt, (past, past))
    before = {txt: (txt.read_bytes(), txt.stat().st_mtime_ns) for txt in kept}

    result = run_stage(ws, config(ws, prefix="ohwx", suffix="4k photo"))

    assert result.returncode == 0, result.stdout + result.stderr
    for txt in missing:
        text = txt.read_text(encoding="utf-8").strip()
        assert text.startswith("ohwx, ") and text.endswith(", 4k photo"), text
        assert len(text) > len("ohwx, , 4k photo")  # the model's words are in between
    for txt, (data, mtime) in before.items():
        assert (txt.read_bytes(), txt.stat().st_mtime_ns) == (data, mtime)
    assert not list(ws.glob("data/pics/*.bak*"))
    assert "captioned 2/2" in result.stdout
    assert "kept 2 existing caption(s)" in result.stdout


def test_overwrite_keeps_each_old_caption_as_bak(tmp_path: Path, captioner_dir: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    ws, paths = workspace_with(tmp_path, captioner_dir, images=2)
    old = {p: p.with_suffix(".txt").read_text(encoding="utf-8") for p in paths}
    earlier_bak = paths[1].with_suffix(".txt.bak")
    earlier_bak.write_text("an older backup", encoding="utf-8")

    result = caption_in_process(ws, config(ws, overwrite=True), capsys)

    assert result.returncode == 0, result.stdout + result.stderr
    first, second = (p.with_suffix(".txt") for p in paths)
    assert first.with_name(first.name + ".bak").read_text(encoding="utf-8") == old[paths[0]]
    # An existing backup is never overwritten: the next free name gets the old caption.
    assert earlier_bak.read_text(encoding="utf-8") == "an older backup"
    assert second.with_name(second.name + ".bak2").read_text(encoding="utf-8") == old[paths[1]]
    for path in paths:
        assert path.with_suffix(".txt").read_text(encoding="utf-8").strip() != old[path]
    assert "2 old caption(s) kept as .bak" in result.stdout


def test_a_corrupt_image_is_skipped_and_named_the_others_captioned(
        tmp_path: Path, captioner_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws, paths = workspace_with(tmp_path, captioner_dir, images=3)
    for path in paths:
        path.with_suffix(".txt").unlink()
    broken = paths[1]
    broken.write_bytes(broken.read_bytes()[:60])  # a truncated PNG

    result = caption_in_process(ws, config(ws), capsys)

    assert result.returncode == 0, result.stdout + result.stderr
    assert paths[0].with_suffix(".txt").read_text(encoding="utf-8").strip()
    assert paths[2].with_suffix(".txt").read_text(encoding="utf-8").strip()
    assert not broken.with_suffix(".txt").exists()
    summary = result.stdout[result.stdout.index("summary:"):]
    assert "skipped 1 image(s)" in summary and str(broken) in summary


@pytest.mark.parametrize("sets, key, words", [
    (["captioning.model="], "captioning.model", "no captioning model set"),
    (["captioning.datasets=['pics', 'nope']"], "captioning.datasets", "'nope'"),
    (["captioning.datasets=['names']"], "captioning.datasets", "datasets.1.caption"),
    (["captioning.model=models/missing-folder"], "captioning.model", "models/missing"),
])
def test_check_refuses_a_bad_captioning_config_naming_the_key(
        tmp_path: Path, captioner_dir: Path, sets: list[str], key: str, words: str) -> None:
    ws, paths = workspace_with(tmp_path, captioner_dir, images=1)
    paths[0].with_suffix(".txt").unlink()

    result = run_stage(ws, config(ws), *sets)

    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if line.startswith("error")]
    assert any(key in line and words in line for line in errors), result.stdout
    assert not paths[0].with_suffix(".txt").exists()
    assert not (ws / ".caption-jobs").exists()  # refused before a job started


def test_dataset_tab_has_a_caption_area_with_every_captioning_key(tmp_path: Path) -> None:
    from dataclasses import fields

    import gradio as gr

    from core.config.schema import CaptioningConfig
    from ui.app import build_app
    from ui.context import AppContext

    ctx = AppContext(tmp_path / "ws", monitor=False)
    try:
        page = build_app(ctx)
    finally:
        ctx.close()

    def below(block: object):
        for child in getattr(block, "children", None) or []:
            yield child
            yield from below(child)

    dataset = next(b for b in below(page) if isinstance(b, gr.Tab) and b.label == "Dataset")
    area = next(b for b in below(dataset) if getattr(b, "elem_id", "") == "caption-area")
    ids = {getattr(c, "elem_id", None) for c in below(area)}
    assert {f"f-captioning-{f.name}" for f in fields(CaptioningConfig)} <= ids
    assert {"caption-start", "caption-stop", "caption-log"} <= ids


@pytest.mark.slow
def test_the_ui_action_runs_the_same_job_for_the_selected_dataset(
        tmp_path: Path, captioner_dir: Path) -> None:
    from core.config import load_config
    from ui import actions
    from ui.context import AppContext

    ws, paths = workspace_with(tmp_path, captioner_dir, images=2)
    paths[0].with_suffix(".txt").unlink()
    cfg = load_config(config(ws))
    cfg.captioning.datasets = []  # the button's choice (the selected dataset) wins
    ctx = AppContext(ws, monitor=False)
    try:
        with pytest.raises(actions.ActionError) as refused:
            actions.start_caption(ctx, cfg, ["names"])
        assert any(p.where == "captioning.datasets" for p in refused.value.problems)
        job = actions.start_caption(ctx, cfg, ["pics"])
        assert job.handle.wait(timeout=180) == "done", "\n".join(job.log_lines())
        job.poll()
    finally:
        ctx.close()
    assert (job.done, job.total) == (1, 1)
    assert paths[0].with_suffix(".txt").read_text(encoding="utf-8").strip()
    assert any("captioned 1/1" in line for line in job.log_lines())

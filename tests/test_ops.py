"""One set of actions for both front ends: the web UI (and its API) and the headless CLI
take the same path through `core.ops`, so they launch the same command."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from core import ops
from core.config import Config, DatasetConfig, save_config
from core.runs.folder import RunFolder
from core.runs.status import read_status
from tests.conftest import write_shapes
from tests.fixtures.fake_trainer import save_fake_checkpoint

FAKE_TRAINER = "tests.fixtures.fake_trainer"


@pytest.fixture
def fake_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launch the stand-in trainer (a real program, seconds long) instead of the real one;
    everything else (check, run folder, accelerate launch, registry) is the real path."""
    monkeypatch.setattr("core.runs.command.TRAINER_MODULE", FAKE_TRAINER)


def workspace_config(workspace: Path, processes: int) -> Config:
    write_shapes(workspace / "data/a", 2)
    cfg = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a",
                                         resolution=64)])
    cfg.output.dir = "runs/r"
    cfg.launch.cpu = True
    cfg.launch.num_processes = processes
    return cfg


def launch_layout(command: str) -> tuple[str, str]:
    argv = shlex.split(command)
    return argv[argv.index("--num_processes") + 1], argv[argv.index("--resume") + 1]


def resumed_command(run_dir: Path) -> str:
    """command.txt of the resume just started, once the run has ended."""
    return RunFolder(run_dir).command.read_text(encoding="utf-8").strip()


@pytest.mark.slow
def test_ui_api_and_headless_resume_launch_the_same_command(tmp_path: Path, fake_trainer):
    from core.runs.prepare import prepare_run_dir
    from ui import actions
    from ui.context import AppContext

    workspace = tmp_path / "ws"
    saved = workspace_config(workspace, processes=1)
    run_dir = ops.output_dir(saved, workspace)
    prepare_run_dir(saved, run_dir, resume=False)  # what a first launch leaves: config.toml
    save_fake_checkpoint(run_dir, 40)  # where the stand-in resumes from

    # The caller's config asks for two processes; a resume keeps the run's saved layout.
    caller = workspace_config(workspace, processes=2)
    ctx = AppContext(workspace, monitor=False)
    try:
        via_api = actions.launch(ctx, caller, resume=True)  # what /launch resume=True does
        assert via_api.handle.wait(timeout=120) == "done"
        api_command = resumed_command(run_dir)
        via_button = actions.resume(ctx, run_dir)  # the Resume button
        assert via_button.handle.wait(timeout=120) == "done"
        button_command = resumed_command(run_dir)
    finally:
        ctx.close()
    assert any(p.where == "launch.num_processes" for p in via_api.warnings)

    from core.headless import run_headless

    save_config(caller, tmp_path / "caller.toml")
    args = argparse.Namespace(workspace=str(workspace), config=str(tmp_path / "caller.toml"),
                              preset=None, overrides=[], stage="all", resume="latest")
    assert run_headless(args) == 0
    headless_command = resumed_command(run_dir)

    assert api_command == button_command == headless_command
    assert launch_layout(headless_command) == ("1", "latest")
    assert read_status(run_dir).state == "done"


def test_a_resume_without_a_run_is_refused_with_the_key(tmp_path: Path):
    workspace = tmp_path / "ws"
    with pytest.raises(ops.OpError) as refused:
        ops.launch(workspace_config(workspace, processes=1), workspace, resume="latest")
    assert refused.value.problems[0].where == "output.dir"
    assert "nothing to resume" in refused.value.message
    assert not (workspace / "runs/r").exists()


@pytest.mark.slow  # a real cache-stage subprocess: the full suite's, not test-fast's
def test_headless_cache_stage_runs_under_the_run_manager_and_logs_to_cache_log(
        tmp_path: Path, tiny_workspace: Path, capsys: pytest.CaptureFixture[str]):
    from core.headless import run_headless

    cfg = workspace_config(tiny_workspace / "cache-stage", processes=1)
    cfg.datasets[0].images = str(tiny_workspace / "cache-stage/data/a")
    cfg.datasets[0].vae_cache = str(tmp_path / "cache/a")
    cfg.text_cache.dir = str(tmp_path / "cache/text")
    save_config(cfg, tmp_path / "run.toml")
    args = argparse.Namespace(workspace=str(tiny_workspace), config=str(tmp_path / "run.toml"),
                              preset=None, overrides=[], stage="cache", resume=None)
    assert run_headless(args) == 0
    out = capsys.readouterr().out
    jobs = sorted((tiny_workspace / ".cache-jobs").iterdir())
    log = RunFolder(jobs[-1], kind="cache").log
    assert log.name == "cache.log" and f"(log: {log})" in out
    assert "vae cache: 2 image(s)" in log.read_text()
    assert "vae cache: 2 image(s)" in out  # the builder's log is echoed
    assert len(list((tmp_path / "cache/a").rglob("*.safetensors"))) == 2
    assert not (jobs[-1] / "train.log").exists()
    assert read_status(jobs[-1]).state == "done"


@pytest.mark.slow
def test_a_launch_over_its_card_says_so_with_the_swap_that_fits(tmp_path: Path, fake_trainer):
    """A run whose estimate is more than the card (launch.gpu_memory_gib here) starts
    with the estimate's warning beside it, naming the setting that would fit, before the
    trainer loads anything: an unquantized Qwen-Image planned for 24 GiB."""
    workspace = tmp_path / "ws"
    cfg = workspace_config(workspace, processes=1)
    cfg.launch.cpu = False  # planned for a GPU; the stand-in trainer runs anyway
    cfg.model.family, cfg.model.path = "qwen_image", "random:qwen_image"
    cfg.datasets[0].resolution = 1024
    cfg.launch.gpu_memory_gib = 24
    cfg.train.mixed_precision, cfg.train.gradient_checkpointing = "bf16", True
    launched = ops.launch(cfg, workspace)
    assert launched.handle.wait(timeout=120) == "done"
    [memory] = [p for p in launched.warnings if p.where == "memory"
                and "planned GPU" in p.message]
    assert "more than the planned GPU has (24.0 GiB" in memory.message
    assert "model.blocks_to_swap = " in memory.message
    cfg.model.quantize = "int8"  # 23.0 GiB: fits, nothing said
    cfg.output.dir = "runs/r2"
    launched = ops.launch(cfg, workspace)
    assert launched.handle.wait(timeout=120) == "done"
    assert [p for p in launched.warnings if "planned GPU" in p.message] == []


def test_save_caption_writes_an_image_of_any_dataset_and_nothing_else(tmp_path: Path):
    """The caption editor's Save (issue 40 item 8): an image of any of the config's
    datasets, not only of the one shown; never a .txt outside the datasets."""
    from core.ops import OpError, save_caption
    from tests.conftest import small_config

    cfg = small_config(tmp_path, datasets=2, images=2)
    image = Path(cfg.datasets[0].images) / "img_001.png"
    assert save_caption(cfg, tmp_path, str(image), "  a  new\ncaption ") == \
        image.with_suffix(".txt")
    assert image.with_suffix(".txt").read_text() == "a new caption\n"
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(image.read_bytes())
    for path in (str(outside), str(image.with_suffix(".txt")), ""):
        with pytest.raises(OpError, match="click an image of the preview first"):
            save_caption(cfg, tmp_path, path, "x")
    assert not outside.with_suffix(".txt").exists()

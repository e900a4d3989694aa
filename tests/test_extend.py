"""Resume on a finished run is refused (it would only rewrite the final checkpoint and
LoRA); Extend trains it on to a larger train.max_steps and keeps the old final LoRA."""

from __future__ import annotations

import argparse
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import app_in_process

from core import ops
from core.config import load_config
from core.runs.folder import LORA_WEIGHTS_NAME, RunFolder
from core.runs.prepare import prepare_run_dir
from core.runs.status import read_status, write_status
from tests.fixtures.fake_trainer import save_fake_checkpoint
from tests.test_ops import fake_trainer, workspace_config  # noqa: F401 (a fixture)


def done_run(workspace: Path, step: int = 40) -> Path:
    """A run folder as a finished LoRA run leaves it, without its lora/step_ folder (an
    older version wrote none at the end)."""
    cfg = workspace_config(workspace, processes=1)
    cfg.train.max_steps = step
    run_dir = ops.output_dir(cfg, workspace)
    prepare_run_dir(cfg, run_dir, resume=False)
    write_status(run_dir, state="done", step=step, max_steps=step)
    lora = RunFolder(run_dir).lora
    lora.mkdir()
    (lora / LORA_WEIGHTS_NAME).write_bytes(b"final lora of step 40")
    (lora / "kohya.safetensors").write_bytes(b"kohya file of step 40")
    save_fake_checkpoint(run_dir, step)  # the stand-in resumes here
    return run_dir


def test_resume_of_a_done_run_is_refused_naming_max_steps_and_changes_nothing(
        tmp_path: Path):
    workspace = tmp_path / "ws"
    run_dir = done_run(workspace)
    config_before = RunFolder(run_dir).config.read_text()
    with pytest.raises(ops.OpError) as refused:
        ops.resume(run_dir, workspace)
    assert refused.value.problems[0].where == "train.max_steps"
    assert "Extend" in refused.value.message and "done" in refused.value.message
    assert RunFolder(run_dir).config.read_text() == config_before
    assert not RunFolder(run_dir).lora_step(40).exists()
    assert read_status(run_dir).state == "done"
    with pytest.raises(ops.OpError) as smaller:  # extending to fewer steps: same refusal
        ops.extend(run_dir, workspace, 40)
    assert smaller.value.problems[0].where == "train.max_steps"


@pytest.mark.slow
def test_extend_keeps_the_final_lora_and_resumes_with_the_larger_max_steps(
        tmp_path: Path, fake_trainer):  # noqa: F811
    workspace = tmp_path / "ws"
    run_dir = done_run(workspace)
    launched = ops.extend(run_dir, workspace, 90)
    assert launched.handle.wait(timeout=120) == "done"
    kept = RunFolder(run_dir).lora_step(40)
    assert (kept / LORA_WEIGHTS_NAME).read_bytes() == b"final lora of step 40"
    assert (kept / "kohya.safetensors").read_bytes() == b"kohya file of step 40"
    assert load_config(RunFolder(run_dir).config).train.max_steps == 90
    argv = shlex.split(RunFolder(run_dir).command.read_text())
    assert argv[argv.index("--resume") + 1] == "latest"
    assert any(p.where == "train.max_steps" and "from step 40 to 90" in p.message
               for p in launched.warnings)


@pytest.mark.slow
def test_headless_resume_with_a_larger_max_steps_extends_a_done_run(
        tmp_path: Path, fake_trainer, capsys: pytest.CaptureFixture[str]):  # noqa: F811
    from core.headless import run_headless

    workspace = tmp_path / "ws"
    run_dir = done_run(workspace)
    config = str(RunFolder(run_dir).config)

    def headless(*overrides: str) -> int:
        return run_headless(argparse.Namespace(
            workspace=str(workspace), config=config, preset=None, overrides=list(overrides),
            stage="all", resume="latest"))

    assert headless() == 2  # same max_steps: refused, naming the key
    assert "error: train.max_steps:" in capsys.readouterr().err
    assert headless("train.max_steps=60") == 0
    assert load_config(RunFolder(run_dir).config).train.max_steps == 60
    assert (RunFolder(run_dir).lora_step(40) / LORA_WEIGHTS_NAME).exists()


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


def test_resume_from_a_checkpoint_that_is_not_there_is_refused_before_anything_changes(
        tmp_path: Path):
    """The trainer would find out only after loading the model, and the extension would
    already have rewritten config.toml and turned the done run into a failed one."""
    workspace = tmp_path / "ws"
    run_dir = done_run(workspace)
    before = tree(workspace)
    done = app_in_process("--no-ui", "--workspace", str(workspace), "--config",
                          str(RunFolder(run_dir).config), "--resume", "step_000099",
                          "--set", "train.max_steps=60")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: --resume:" in done.stderr and "step_000099" in done.stderr
    assert "it has step_000040" in done.stderr  # what can be resumed instead
    assert tree(workspace) == before
    assert read_status(run_dir).state == "done"


def test_extending_a_run_without_checkpoints_is_refused_and_changes_nothing(tmp_path: Path):
    workspace = tmp_path / "ws"
    run_dir = done_run(workspace)
    shutil.rmtree(RunFolder(run_dir).checkpoints)
    before = tree(workspace)
    with pytest.raises(ops.OpError) as refused:
        ops.extend(run_dir, workspace, 60)
    assert refused.value.exit_code == 2
    assert refused.value.problems[0].where == "--resume"
    assert "no checkpoint" in refused.value.problems[0].message
    assert tree(workspace) == before  # no extend event, no lora/step_000040, same config


def _tensors(path: Path) -> dict[str, bytes]:
    """A safetensors file's tensors as bytes. Not the file's bytes: safetensors writes
    its metadata in hash-map order, which differs between two saves of the same LoRA."""
    from safetensors.torch import load_file

    return {k: v.numpy().tobytes() for k, v in load_file(str(path)).items()}


@pytest.mark.slow
def test_a_real_done_run_extends_from_its_final_step_and_keeps_its_lora(
        tmp_path: Path, tiny_workspace: Path):
    from tests.test_train import _config, _start, app, step_losses

    cfg, run_dir = _config(tmp_path, tiny_workspace, 4)
    assert _start(cfg, tiny_workspace).wait(timeout=600) == "done"
    final = _tensors(RunFolder(run_dir).lora_weights)
    again = app("--config", str(run_dir / "config.toml"), "--resume",
                workspace=tiny_workspace)
    assert again.returncode == 2 and "train.max_steps" in again.stderr
    extended = app("--config", str(run_dir / "config.toml"), "--resume",
                   "--set", "train.max_steps=7", workspace=tiny_workspace)
    assert extended.returncode == 0, extended.stdout[-3000:] + extended.stderr[-3000:]
    assert sorted(step_losses(run_dir)) == [1, 2, 3, 4, 5, 6, 7]  # 5-7 are new
    assert _tensors(RunFolder(run_dir).lora_step(4) / LORA_WEIGHTS_NAME) == final
    assert _tensors(RunFolder(run_dir).lora_weights) != final
    assert read_status(run_dir).state == "done" and read_status(run_dir).step == 7

"""Start-up: the trainer says where its time went before the first step, evaluates at step 0
only when asked, and leaves out optional libraries the run does not use.
bench/startup.py measures the figures; the real launch's phases are checked in
tests/test_train.py."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, app_and_loaded_modules, small_config, train_events

from core.config import save_config
from core.libraries import unused_optional_libraries

IN_PROCESS_PHASES = ["interpreter", "imports", "accelerator", "model", "caches", "setup",
                     "eval_set", "first_step"]  # "interpreter": here the config read alone


def _train(folder: Path, **train: object) -> list[dict]:
    cfg = small_config(folder, images=4)
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 2, 100, 100
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return train_events(cfg, folder)


@pytest.mark.slow
def test_startup_event_names_each_phase_and_step_0_eval_only_when_asked(tmp_path, capsys):
    quiet = _train(tmp_path / "default")
    assert [e["step"] for e in quiet if e["type"] == "eval"] == [2], "no step-0 eval"
    startup = [e for e in quiet if e["type"] == "startup"]
    assert len(startup) == 1
    phases = startup[0]["phases"]
    assert list(phases) == IN_PROCESS_PHASES
    assert all(seconds >= 0 for seconds in phases.values())
    assert abs(sum(phases.values()) - startup[0]["total_s"]) < 0.01
    first_step = next(e for e in quiet if e["type"] == "step")
    assert startup[0]["time"] >= first_step["time"], "written once the first step is done"
    assert "started in " in capsys.readouterr().out

    asked = _train(tmp_path / "asked", eval_before_training=True)
    assert [e["step"] for e in asked if e["type"] == "eval"] == [0, 2]
    (startup,) = [e for e in asked if e["type"] == "startup"]
    assert list(startup["phases"]) == [*IN_PROCESS_PHASES[:-1], "eval", "first_step"]


def test_a_run_leaves_out_bitsandbytes_and_torchao_unless_it_uses_them():
    from core.config.optimizers import optimizer_package

    def unused(optimizer: str, quantize: str) -> list[str]:
        return unused_optional_libraries(optimizer_package(optimizer), quantize)

    assert unused("adamw", "none") == ["bitsandbytes", "torchao"]
    assert unused("adamw8bit", "none") == ["torchao"]
    assert unused("adamw", "nf4") == ["torchao"]
    assert unused("adamw", "int8") == ["bitsandbytes"]
    assert unused("prodigy", "fp8") == ["bitsandbytes"]


@pytest.mark.slow
def test_peft_and_diffusers_work_with_the_unused_libraries_left_out():
    """The trainer's own process skips them before importing anything: peft still adds a
    LoRA to a diffusers model, and neither library was imported."""
    code = """
import sys
from core.libraries import skip_libraries, unused_optional_libraries
skip_libraries(unused_optional_libraries("", "none"))
import torch, peft, diffusers
from diffusers import UNet2DConditionModel
unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4,
                            block_out_channels=(8, 16), layers_per_block=1,
                            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                            cross_attention_dim=8, norm_num_groups=4, attention_head_dim=2)
unet.add_adapter(peft.LoraConfig(r=2, target_modules=["to_q", "to_k"]))
trained = sum(p.numel() for p in unet.parameters() if p.requires_grad)
print(trained, sys.modules.get("bitsandbytes"), sys.modules.get("torchao"))
"""
    done = subprocess.run([PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    trained, bnb, torchao = done.stdout.split()[-3:]
    assert int(trained) > 0
    assert (bnb, torchao) == ("None", "None")


@pytest.mark.slow
def test_the_headless_check_leaves_out_the_libraries_its_config_does_not_use(
        tmp_path: Path, tiny_workspace: Path, monkeypatch: pytest.MonkeyPatch):
    """`app.py --no-ui` checks one config, then follows the run in another process: its
    memory estimate adds the adapter with peft, which would import bitsandbytes and
    torchao whenever they are installed. A config that uses bitsandbytes still finds it."""
    cfg = small_config(tmp_path, images=2)
    save_config(cfg, tmp_path / "run.toml")

    def loaded(*overrides: str) -> list[str]:
        """The libraries a real `python app.py --no-ui --stage check` process holds,
        counting the model (no disk cache of its sizes: peft adds the adapter)."""
        monkeypatch.setenv("DT_CACHE_DIR", tempfile.mkdtemp(dir=tmp_path))
        done, modules = app_and_loaded_modules(
            "--no-ui", "--stage", "check", "--config", str(tmp_path / "run.toml"),
            "--workspace", str(tiny_workspace), *overrides,
            modules=("bitsandbytes", "peft", "torchao"))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return modules

    assert loaded() == ["peft"], "peft counts the adapter; the optional ones stay out"
    assert loaded("--set", "train.optimizer=adamw8bit") == ["bitsandbytes", "peft"]


def test_a_program_ended_by_exit_with_keeps_its_code_its_exit_handlers_and_its_output(
        tmp_path: Path):
    """core.exits.exit_with (how the trainer, the cache builder and the captioner end)
    leaves out only the collector's last walks: the exit code, the exit handlers, the
    buffered output and a file still open in a module all arrive as with sys.exit."""
    script = (
        "import atexit, sys\n"
        "from core.exits import exit_with\n"
        "atexit.register(lambda: open(sys.argv[1], 'w').write('the handler ran'))\n"
        "kept = open(sys.argv[2], 'w')\n"
        "kept.write('left open')\n"
        "print('a line without its newline', end='')\n"
        "exit_with(3)\n")
    handler, kept = tmp_path / "handler.txt", tmp_path / "kept.txt"
    done = subprocess.run([PYTHON, "-c", script, str(handler), str(kept)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "a line without its newline"
    assert handler.read_text() == "the handler ran" and kept.read_text() == "left open"


def test_libraries_loaded_outside_collections_are_frozen_and_collections_resume():
    """core.libraries.loaded_outside_collections (the trainer's, the cache builder's and
    the captioner's imports): no collection while inside, what was made there frozen
    after, and the collector running again even when an import fails."""
    import gc

    from core.libraries import loaded_outside_collections

    frozen = gc.get_freeze_count()
    with pytest.raises(ImportError), loaded_outside_collections():
        assert not gc.isenabled()
        made = [[n] for n in range(1000)]  # objects the collector tracks
        import a_library_that_is_not_installed  # noqa: F401
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(made)

"""The CLI contract: --help, --stage check output and exit codes, no side effects."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, app_and_loaded_modules, check_in_process, write_shapes

from core.config import Config, DatasetConfig, save_config


def app(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(REPO / "app.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*"))


def test_help_lists_every_flag_of_the_contract_without_heavy_imports():
    done = app("--help")
    assert done.returncode == 0
    for flag in ("--listen", "--port", "--share", "--auth", "--auth-file", "--no-ui",
                 "--preset", "--config", "--stage", "--set", "--workspace", "--no-auth",
                 "--resume"):
        assert flag in done.stdout, flag
    from core.models.registry import list_families

    # Every family the registry knows, not a hand-kept subset of them.
    missing = set(list_families()) - set(re.findall(r"\w+", done.stdout))
    assert not missing, f"--help leaves out {sorted(missing)}"
    _, heavy = app_and_loaded_modules(
        "--help", modules=("torch", "gradio", "diffusers", "transformers"), timeout=60)
    assert heavy == [], heavy


def layout(tmp: Path) -> Path:
    """A config with one conflict (cache inside images), one warning, one bad image."""
    write_shapes(tmp / "ws/data/a", 5)
    write_shapes(tmp / "ws/data/b", 3, size=(128, 64))
    (tmp / "ws/data/b/broken.png").write_bytes(b"")
    cfg = Config(datasets=[
        DatasetConfig(id="a", images="data/a", vae_cache="data/a/.cache", resolution=64),
        DatasetConfig(id="b", images="data/b", vae_cache="cache/b", resolution=128),
        DatasetConfig(id="c", images="data/b", vae_cache="cache/c", resolution=64),
    ])
    cfg.output.dir = "runs/x"
    save_config(cfg, tmp / "run.toml")
    return tmp / "run.toml"


def test_check_prints_errors_then_warnings_then_summary_and_exits_2(tmp_path: Path):
    config = layout(tmp_path)
    before = tree(tmp_path)
    done = check_in_process("--config", str(config), "--workspace", str(tmp_path / "ws"))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "== check"
    levels = [line.split(":")[0] for line in lines[1:] if line.startswith(("error", "warning"))]
    assert levels == sorted(levels), "errors come before warnings"
    text = done.stdout
    assert "error: datasets.0.vae_cache: dataset 'a' vae_cache" in text
    assert str(tmp_path / "ws/data/a") in text and "datasets.0.images" in text
    assert f"warning: {tmp_path / 'ws/data/b/broken.png'}" in text
    assert "warning: datasets.2.images" in text and "datasets.1.images" in text
    assert "summary: 1 error(s)" in text
    assert "dataset 'a': 5 image(s)" in text and "dataset 'b': 3 image(s)" in text
    assert "    64x64 " in text and "    256x64 " in text, "a 2:1 image gets a wide bucket"
    assert "steps per epoch:" in text
    assert tree(tmp_path) == before, "--stage check must create and change nothing"


@pytest.mark.slow
def test_check_of_a_clean_config_exits_0(tmp_path: Path):
    write_shapes(tmp_path / "data/a", 4)
    cfg = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a",
                                         resolution=64)])
    save_config(cfg, tmp_path / "run.toml")
    done = app("--no-ui", "--config", str(tmp_path / "run.toml"), "--workspace", str(tmp_path),
               "--stage", "check", "--set", "train.batch_size=2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "summary: 0 error(s), 0 warning(s)" in done.stdout
    assert "steps per epoch: 2 (optimizer steps)" in done.stdout


def test_unknown_key_and_bad_override_exit_2_naming_the_key(tmp_path: Path):
    (tmp_path / "bad.toml").write_text('version = 1\n[train]\nmax_step = 3\n', encoding="utf-8")
    done = app("--no-ui", "--config", str(tmp_path / "bad.toml"), "--stage", "check")
    assert done.returncode == 2
    assert "train.max_step" in done.stderr and "max_steps" in done.stderr
    done = app("--no-ui", "--preset", "demo", "--stage", "check", "--set", "train.seed=x",
               "--workspace", str(tmp_path))
    assert done.returncode == 2 and "train.seed: expected an integer" in done.stderr


def test_missing_source_or_preset_is_explained(tmp_path: Path):
    done = app("--no-ui", "--stage", "check")
    assert done.returncode == 2 and "--preset demo" in done.stderr
    done = app("--no-ui", "--preset", "nope", "--stage", "check")
    assert done.returncode == 2 and "no preset named 'nope'" in done.stderr
    assert "demo" in done.stderr


def test_preset_name_is_not_shadowed_by_a_folder_of_that_name(tmp_path: Path,
                                                                monkeypatch) -> None:
    """The demo writes its images to <workspace>/demo/: run from the workspace, `--preset
    demo` must still load presets/demo.toml, not try to read that folder."""
    from core import ops
    from core.presets import is_demo

    (tmp_path / "demo").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = ops.load_run_config(None, "demo", [])
    assert cfg.model.path == "tiny:sd15-shapes" and is_demo("demo")
    (tmp_path / "mine.toml").write_text((REPO / "presets/demo.toml").read_text())
    assert ops.load_run_config(None, "mine.toml", ["train.max_steps=7"]).train.max_steps == 7


def test_workspace_that_is_a_file_is_refused_naming_it_and_nothing_is_written(
        tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a folder")
    before = tree(tmp_path)
    for workspace in ("notes.txt", "notes.txt/sub"):
        done = app("--no-ui", "--preset", "demo", "--workspace", workspace, cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.startswith(f"error: --workspace: {tmp_path / workspace} "), \
            done.stderr
        assert "Traceback" not in done.stderr and "datasets." not in done.stderr
    assert tree(tmp_path) == before


def test_relative_workspace_resolves_from_the_current_folder(tmp_path: Path):
    write_shapes(tmp_path / "ws/data/a", 2)
    cfg = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a",
                                         resolution=64)])
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", "run.toml", "--workspace", "ws", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "ws/cache").exists()
    assert os.listdir(tmp_path / "ws") == ["data"]


def test_resume_hint_after_a_stop_names_the_workspace(tmp_path: Path, capsys) -> None:
    from core.headless import summarize_run

    workspace = tmp_path / "elsewhere"
    (workspace / "runs/demo/checkpoints/step_000010").mkdir(parents=True)
    summarize_run(workspace / "runs/demo", "stopped", workspace)
    hint = capsys.readouterr().out.splitlines()[-1]
    # Without --workspace the saved config's relative paths would resolve to ./workspace.
    assert hint.startswith("resume with:") and f"--workspace {workspace} " in hint
    assert hint.endswith(f"--config {workspace / 'runs/demo/config.toml'} --resume")


def test_resume_hint_on_several_machines_asks_for_each_machines_rank(tmp_path: Path,
                                                                      capsys) -> None:
    from core.config import LaunchConfig
    from core.headless import summarize_run

    launch = LaunchConfig(num_machines=2, machine_rank=1, main_process_ip="10.0.0.1")
    (tmp_path / "runs/r/checkpoints/step_000010").mkdir(parents=True)
    summarize_run(tmp_path / "runs/r", "stopped", tmp_path, launch)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"run stopped: {tmp_path / 'runs/r'} (machine 1 of 2)"
    assert lines[-1].startswith("resume on every machine with: ")
    assert lines[-1].endswith(f"--config {tmp_path / 'runs/r/config.toml'} --resume --set "
                              "launch.machine_rank=N (this is machine 1)")


@pytest.mark.parametrize("state", ["stopped", "failed", "done"])
def test_a_run_without_a_checkpoint_is_not_offered_a_resume(tmp_path: Path, state: str,
                                                              capsys) -> None:
    """--resume refuses a run with no checkpoint (it failed before its first one): the
    closing summary must not suggest it."""
    from core.headless import summarize_run

    summarize_run(tmp_path / "runs/r", state, tmp_path)
    out = capsys.readouterr().out
    assert "--resume" not in out, out
    if state != "done":
        assert out.splitlines()[-1].startswith("no checkpoint was saved, so it cannot be "
                                               "resumed")


def test_adamw8bit_without_bitsandbytes_is_an_error_at_check(tmp_path: Path,
                                                              monkeypatch) -> None:
    write_shapes(tmp_path / "data/a", 2)
    cfg = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a",
                                         resolution=64)])
    save_config(cfg, tmp_path / "run.toml")
    # requirements.txt installs bitsandbytes: the check runs as on a machine without it.
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # find_spec: None; import fails
    done = check_in_process("--config", str(tmp_path / "run.toml"), "--workspace",
                            str(tmp_path), "--set", "train.optimizer=adamw8bit")
    assert done.returncode == 2, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "error: train.optimizer:" in out
    assert "pip install bitsandbytes" in out and '"adamw"' in out


def test_a_ctrl_c_while_a_run_starts_is_kept_for_the_stop_not_raised():
    """Raised inside ops.launch, after the launcher started in its own session, a Ctrl-C
    left that run going with nobody following it (status "starting" forever): it is
    noted there, and the follow stops the run at once (tests/test_machines.py sends one
    right after machine 1's "joining" line)."""
    import os
    import signal

    from core.headless import deferred_interrupt

    before = signal.getsignal(signal.SIGINT)  # a pytest-xdist worker ignores it
    with deferred_interrupt() as asked:
        os.kill(os.getpid(), signal.SIGINT)
        assert asked == [True]
    assert signal.getsignal(signal.SIGINT) is before, "the handler is put back"


def test_a_ctrl_c_as_the_training_launch_returns_stops_that_run(
        tmp_path: Path, tiny_workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--no-ui` training: a Ctrl-C that lands just as ops.launch has started the
    launcher (in its own session, out of the terminal's reach) is kept until the follow
    begins, which stops that run: it ends "stopped" with none of its processes left,
    rather than the CLI quitting "before a run started" with the run going on unfollowed."""
    import signal

    from conftest import app_in_process, small_config

    from core import ops
    from core.runs.status import read_status

    real_launch, launched = ops.launch, []

    def launch_then_ctrl_c(*args, **kwargs):
        result = real_launch(*args, **kwargs)
        launched.append(result)
        os.kill(os.getpid(), signal.SIGINT)  # the terminal's Ctrl-C
        return result

    monkeypatch.setattr(ops, "launch", launch_then_ctrl_c)
    # As in a terminal (a pytest-xdist worker ignores SIGINT): a Ctrl-C raises.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    cfg = small_config(tmp_path, images=2)
    cfg.train.max_steps, cfg.validation.prompts, cfg.launch.cpu = 1000, [], True
    save_config(cfg, tmp_path / "run.toml")
    try:
        done = app_in_process("--no-ui", "--config", str(tmp_path / "run.toml"),
                              "--workspace", str(tiny_workspace))
    finally:
        signal.signal(signal.SIGINT, previous)
        for result in launched:  # whatever a failure left running
            for pid in result.handle.processes():
                os.kill(pid, signal.SIGKILL)
    [result] = launched
    assert done.returncode == 130, done.stdout[-3000:] + done.stderr[-3000:]
    assert "stopped before a run started" not in done.stdout
    assert "stopping: the trainer saves" in done.stdout
    assert result.handle.processes() == {}
    assert read_status(result.run_dir).state == "stopped"

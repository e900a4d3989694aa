"""The trainer end to end: real `accelerate launch` runs of the demo on tiny models."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, small_config, train_in_process

from core.config import Config, save_config
from core.runs.command import build_accelerate_command
from core.runs.manager import start_run
from core.runs.prepare import prepare_run_dir
from core.runs.status import read_status

pytestmark = pytest.mark.slow

FAST = ["train.max_steps=8", "train.checkpoint_every=4", "train.eval_every=4",
        "validation.every=4", "validation.steps=2", "validation.resolution=64",
        "datasets.0.resolution=64", "train.eval_images=4"]


def app(*args: str, workspace: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "app.py", "--no-ui", "--workspace", str(workspace), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def events(run_dir: Path) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def step_losses(run_dir: Path) -> dict[int, float]:
    out = {}
    for event in events(run_dir):
        if event["type"] == "step":
            out[event["step"]] = event["loss"]
    return out


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    workspace = tmp_path_factory.mktemp("demo")
    done = app("--preset", "demo", *sum([["--set", s] for s in FAST], []),
               workspace=workspace)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return workspace, workspace / "runs/demo", done.stdout


def test_demo_run_writes_the_whole_run_folder(demo_run):
    workspace, run_dir, stdout = demo_run
    for name in ("config.toml", "command.txt", "train.log", "events.jsonl", "status.json"):
        assert (run_dir / name).is_file(), name
    assert "accelerate" in (run_dir / "command.txt").read_text()
    assert read_status(run_dir).state == "done"
    assert read_status(run_dir).step == 8
    kinds = {e["type"] for e in events(run_dir)}
    assert {"step", "eval", "validation", "checkpoint", "status"} <= kinds
    assert sorted(step_losses(run_dir)) == list(range(1, 9))
    assert (run_dir / "validation/step_000004/00.png").is_file()
    assert (run_dir / "validation/step_000008/02.png").is_file()
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step_000004", "step_000008"], "keep_checkpoints=2 keeps the newest"
    lora = run_dir / "lora/pytorch_lora_weights.safetensors"
    assert lora.is_file()
    assert f"LoRA: {lora}" in stdout and "validation images:" in stdout
    assert "step 8/8" in (run_dir / "train.log").read_text()


def test_demo_launch_says_where_its_start_up_time_went(demo_run):
    """A launch by the run manager counts accelerate's launcher and the interpreter too;
    the demo asks for the step-0 eval and the before-training validation."""
    _, run_dir, _ = demo_run
    all_events = events(run_dir)
    (startup,) = [e for e in all_events if e["type"] == "startup"]
    assert list(startup["phases"]) == [
        "launcher", "interpreter", "imports", "accelerator", "model", "caches", "setup",
        "eval_set", "eval", "validation", "first_step"]
    started = json.loads((run_dir / "status.json").read_text())["started_at"]
    first_step = next(e["time"] for e in all_events if e["type"] == "step")
    # The phases account for the wall time from the manager's start to the first step.
    assert abs(started + startup["total_s"] - first_step) < 1.0
    assert 0 in [e["step"] for e in all_events if e["type"] == "eval"]
    assert "started in " in (run_dir / "train.log").read_text()


def test_demo_lora_loads_in_diffusers_and_changes_the_image(demo_run):
    import torch
    from diffusers import StableDiffusionPipeline

    workspace, run_dir, _ = demo_run
    pipe = StableDiffusionPipeline.from_pretrained(str(workspace / "models/tiny-sd15-shapes"),
                                                   local_files_only=True, safety_checker=None)
    pipe.set_progress_bar_config(disable=True)

    def image() -> torch.Tensor:
        out = pipe("a red circle", num_inference_steps=2, height=64, width=64,
                   generator=torch.Generator().manual_seed(0), output_type="pt")
        return out.images[0]

    before = image()
    pipe.load_lora_weights(str(run_dir / "lora"))
    after = image()
    assert (after - before).abs().max() > 1e-4


def test_demo_runs_again_into_a_new_folder(demo_run):
    workspace, run_dir, _ = demo_run
    done = app("--preset", "demo", "--stage", "check", workspace=workspace)
    assert done.returncode == 0
    again = app("--preset", "demo", *sum([["--set", s] for s in FAST], []),
                "--set", "train.max_steps=1", workspace=workspace)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "holds an earlier demo run" in again.stdout
    assert read_status(workspace / "runs/demo-2").state == "done"
    assert read_status(run_dir).step == 8, "the first run is untouched"


def test_same_output_folder_is_refused_with_instructions(demo_run):
    workspace, run_dir, _ = demo_run
    done = app("--config", str(run_dir / "config.toml"), workspace=workspace)
    assert done.returncode == 2
    assert "it is not overwritten" in done.stderr and "--resume" in done.stderr


# Long enough that a stop at step 7 (or a kill after the checkpoint at 5) lands well
# before the end, with steps left to compare after the resume: a tiny step takes about
# 0.07 s here and status.json is written at most once a second, so a stop asked when
# status.json says 7 may land past step 25 (it did at 30 steps).
STOP_RUN_STEPS = 100


def _config(tmp: Path, workspace: Path, steps: int, **train) -> tuple[Config, Path]:
    cfg = small_config(tmp, images=8)
    cfg.train.max_steps = steps
    cfg.train.checkpoint_every = 5
    cfg.train.eval_every = 1000
    cfg.validation.every = 1000
    cfg.validation.prompts = []
    cfg.launch.cpu = True
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg, Path(cfg.output.dir)


def _start(cfg: Config, workspace: Path, resume: str | None = None):
    run_dir = Path(cfg.output.dir)
    prepare_run_dir(cfg, run_dir, resume=bool(resume))
    return start_run(build_accelerate_command(cfg, run_dir, workspace, resume=resume), run_dir)


def _wait_for_step(run_dir: Path, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while (getattr(read_status(run_dir), "step", 0) or 0) < step:
        assert time.monotonic() < deadline, f"no step {step}: {read_status(run_dir)}"
        time.sleep(0.2)


def test_stop_then_resume_continues_the_same_curve(tmp_path: Path, tiny_workspace: Path):
    every = {"checkpoint_every": 50}  # the stop saves its own checkpoint
    reference_cfg, reference_dir = _config(tmp_path / "a", tiny_workspace, STOP_RUN_STEPS,
                                           **every)
    assert _start(reference_cfg, tiny_workspace).wait(timeout=600) == "done"
    reference = step_losses(reference_dir)

    cfg, run_dir = _config(tmp_path / "b", tiny_workspace, STOP_RUN_STEPS, **every)
    handle = _start(cfg, tiny_workspace)
    _wait_for_step(run_dir, 7)
    result = handle.stop(grace_s=120)
    assert result.state == "stopped" and not result.forced
    stopped_at = read_status(run_dir).step
    assert stopped_at < STOP_RUN_STEPS
    assert (run_dir / f"checkpoints/step_{stopped_at:06d}").is_dir()
    assert (run_dir / "lora/pytorch_lora_weights.safetensors").is_file()

    resumed = app("--config", str(run_dir / "config.toml"), "--resume",
                  workspace=tiny_workspace)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in (run_dir / "train.log").read_text()
    losses = step_losses(run_dir)
    later = list(range(stopped_at + 1, STOP_RUN_STEPS + 1))
    assert later, "the resumed run must take steps"
    for step in later:
        assert losses[step] == pytest.approx(reference[step], rel=1e-3, abs=1e-4), step


def test_killed_run_is_marked_failed_and_resumes(tmp_path: Path, tiny_workspace: Path):
    cfg, run_dir = _config(tmp_path, tiny_workspace, STOP_RUN_STEPS)
    handle = _start(cfg, tiny_workspace)
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints/step_000005").is_dir():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(handle.pid, signal.SIGKILL)
    assert handle.wait(timeout=60) == "failed"
    assert read_status(run_dir).state == "failed"
    resumed = app("--config", str(run_dir / "config.toml"), "--resume",
                  workspace=tiny_workspace)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "resumed from" in log and "checkpoints/step_0000" in log
    assert read_status(run_dir).state == "done" and read_status(run_dir).step == STOP_RUN_STEPS


def test_a_trainer_killed_by_sigkill_says_so_in_status_and_the_headless_follow(
        tmp_path: Path, tiny_workspace: Path):
    """`python app.py --no-ui` following a tiny run whose trainer (the launcher's child,
    as the out-of-memory killer picks it: the largest process) gets SIGKILL: accelerate's
    launcher alone would exit 1 with nothing in the log; the run fails saying it was
    killed, what that often is and what needs less memory, at which step, with the
    memory events' peak, in status.json and as the follow's last line."""
    from core.runs.pids import proc_stat

    cfg, run_dir = _config(tmp_path, tiny_workspace, 100000)
    save_config(cfg, tmp_path / "run.toml")
    follow = subprocess.Popen([PYTHON, "app.py", "--no-ui", "--workspace", str(tiny_workspace),
                               "--config", str(tmp_path / "run.toml")], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_step(run_dir, 2)
        status = read_status(run_dir)
        assert proc_stat(status.pid).ppid == status.launcher_pid  # the trainer, not the launcher
        os.kill(status.pid, signal.SIGKILL)
        out, _ = follow.communicate(timeout=120)
    finally:
        follow.kill()
    assert follow.returncode == 1, out[-3000:]
    status = read_status(run_dir)
    last = max(e["step"] for e in events(run_dir) if e["type"] == "step")
    assert status.state == "failed" and status.exit_code == 128 + signal.SIGKILL
    assert status.reason.startswith(
        "the training process was killed by signal 9 (often the out-of-memory killer: this "
        "machine's RAM ran out; the check's host memory line says what the run holds: pin "
        "fewer blocks (a smaller model.blocks_to_swap), run fewer processes, or add RAM or "
        f"swap space) at step {last}/100000; memory: peak "), status.reason
    assert "host RSS" in status.reason  # the CPU's figure: no GPU here
    assert f"error: {status.reason}" in out.splitlines(), out[-3000:]
    assert out.splitlines()[-1].startswith("no checkpoint was saved") or \
        "resume with:" in out.splitlines()[-1]


def test_two_process_cpu_run(tmp_path: Path, tiny_workspace: Path):
    """DDP over two processes with gradient accumulation, on a Flux whose first block
    is swapped (DDP leaves the host-held weights out of its device check and its
    broadcasts); two machines over 127.0.0.1 run sd15 (test_machines.py)."""
    cfg, run_dir = _config(tmp_path, tiny_workspace, 4)
    cfg.model.family, cfg.model.path = "flux", "tiny:flux"
    cfg.model.blocks_to_swap, cfg.train.gradient_checkpointing = 1, True
    cfg.launch.num_processes = 2
    cfg.train.grad_accum = 2
    handle = _start(cfg, tiny_workspace)
    assert handle.wait(timeout=600) == "done", (run_dir / "train.log").read_text()[-3000:]
    starting = [e for e in events(run_dir) if e.get("state") == "starting"]
    assert starting[0]["processes"] == 2
    assert sorted(step_losses(run_dir)) == [1, 2, 3, 4]
    assert [e["swapped"] for e in events(run_dir) if e["type"] == "block_swap"] == [[1]]
    assert (run_dir / "lora/pytorch_lora_weights.safetensors").is_file()


# Each family run also exercises one training option, so every option runs for real.
FAMILY_OPTIONS = {
    "sd2": {"gradient_checkpointing": True, "grad_accum": 2, "min_snr_gamma": 5.0},
    "sdxl": {"mixed_precision": "bf16"},
    "sd3": {"ema": True, "lr_scheduler": "cosine", "lr_warmup_steps": 1},
    "flux": {"method": "full", "lr_scheduler": "linear"},
    "z_image": {"lora_targets": "all", "gradient_checkpointing": True},
    # checkpointing: its single blocks must still get the text mask (families/chroma/family.py)
    "chroma": {"gradient_checkpointing": True, "mixed_precision": "bf16"},
    "qwen_image": {"lora_targets": "all"},
    "flux2": {"lora_targets": "all"},
    "wan": {},
}


# The learning rate each of the 3 steps reports, as a share of train.learning_rate: sd3's
# cosine after 1 warm-up step, flux's linear decay, every other family's constant.
LR_SCHEDULE = {"sd3": [1.0, 0.5, 0.0], "flux": [2 / 3, 1 / 3, 0.0]}


@pytest.mark.parametrize("family", ["sd2", "sdxl", "sd3", "flux", "flux2", "chroma", "z_image",
                                    "qwen_image", "wan"])
def test_each_family_trains_a_few_steps(tmp_path: Path, tiny_workspace: Path, family: str):
    cfg = small_config(tmp_path, images=4, family=family)
    for key, value in FAMILY_OPTIONS[family].items():
        setattr(cfg.train, key, value)
    cfg.train.max_steps = 3
    cfg.train.eval_every = 3
    cfg.validation.every = 3
    cfg.validation.prompts = ["a red circle"]
    save_config(cfg, tmp_path / "run.toml")
    # In-process (the launched program is test_demo_run's and test_two_process_cpu_run's).
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    run_dir = Path(cfg.output.dir)
    assert sorted(step_losses(run_dir)) == [1, 2, 3]
    lrs = [e["lr"] for e in events(run_dir) if e["type"] == "step"]
    shares = LR_SCHEDULE.get(family, [1.0, 1.0, 1.0])
    assert lrs == pytest.approx([f * cfg.train.learning_rate for f in shares], abs=1e-12), lrs
    assert (run_dir / "validation/step_000003/00.png").is_file()
    weights = "model/model_index.json" if cfg.train.method == "full" else \
        "lora/pytorch_lora_weights.safetensors"
    assert (run_dir / weights).is_file()
    if cfg.train.ema:  # the last checkpoint holds the raw weights a resume continues from
        import torch
        from safetensors.torch import load_file

        last = run_dir / "checkpoints/step_000003"
        raw = sorted(float(t.norm()) for t in load_file(last / "trainable.safetensors").values())
        ema = torch.load(last / "ema.pt", weights_only=False)["shadow_params"]
        assert raw != sorted(float(t.norm()) for t in ema)


def test_a_crash_is_recorded_as_failed_with_the_error(tmp_path: Path, tiny_workspace: Path):
    cfg = small_config(tmp_path, images=2)
    cfg.model.path = str(tmp_path / "missing/model.safetensors")
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 1
    run_dir = Path(cfg.output.dir)
    status = read_status(run_dir)
    assert status.state == "failed" and "missing/model.safetensors" in status.reason
    errors = [e for e in events(run_dir) if e["type"] == "error"]
    assert errors and "does not exist" in errors[0]["message"]


def test_full_fine_tune_saves_a_loadable_model(tmp_path: Path, tiny_workspace: Path):
    cfg = small_config(tmp_path, images=4)
    cfg.train.method = "full"
    cfg.train.max_steps = 2
    cfg.validation.prompts = []
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", tiny_workspace) == 0
    from diffusers import StableDiffusionPipeline

    StableDiffusionPipeline.from_pretrained(str(Path(cfg.output.dir) / "model"),
                                            local_files_only=True)

"""launch.distributed: FSDP2 for full fine-tunes (2 CPU processes over gloo, the real
`accelerate launch`), and what check refuses (fsdp with LoRA or EMA, deepspeed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import small_config
from test_train import _start, app, events, step_losses

from core.config import Config, validate_config
from core.runs.command import build_accelerate_command


def _problems(cfg: Config, key: str) -> list[str]:
    return [p.message for p in validate_config(cfg) if p.where == key]


def test_check_refuses_deepspeed_and_fsdp_with_lora_or_ema(tmp_path: Path):
    cfg = small_config(tmp_path)
    cfg.launch.num_processes = 2
    assert _problems(cfg, "launch.distributed") == []  # ddp, the default
    cfg.launch.distributed = "deepspeed"
    assert any("DeepSpeed is not installed or tested" in m
               for m in _problems(cfg, "launch.distributed"))
    cfg.launch.distributed = "fsdp"
    assert any("shards a full fine-tune only" in m and "train.method = \"lora\"" in m
               for m in _problems(cfg, "launch.distributed"))
    cfg.train.method = "full"
    assert [p for p in validate_config(cfg) if p.level == "error"] == []
    cfg.train.ema = True
    assert any("launch.distributed = \"fsdp\"" in m for m in _problems(cfg, "train.ema"))


def test_fsdp_command_uses_accelerates_fsdp2_plugin_on_cpu(tmp_path: Path):
    cfg = small_config(tmp_path)
    cfg.launch.cpu, cfg.launch.num_processes = True, 2
    cfg.launch.distributed = "fsdp"
    spec = build_accelerate_command(cfg, tmp_path / "run", tmp_path, resume=None)
    assert "--use_fsdp" in spec.argv and "--multi_gpu" not in spec.argv
    assert spec.argv[spec.argv.index("--fsdp_version") + 1] == "2"
    assert spec.env["ACCELERATE_USE_CPU"] == "1"  # gloo on the CPU
    cfg.launch.distributed = "ddp"
    ddp = build_accelerate_command(cfg, tmp_path / "run", tmp_path, resume=None)
    assert "--multi_gpu" in ddp.argv and "--use_fsdp" not in ddp.argv


def _fsdp_config(tmp: Path, steps: int) -> Config:
    cfg = small_config(tmp, images=8)
    cfg.train.method = "full"
    cfg.train.learning_rate = 1e-3
    cfg.train.max_steps = steps
    cfg.train.checkpoint_every = 6  # and at the end: a run of 5 steps resumes from 5
    cfg.train.eval_every = 6
    cfg.train.eval_images = 2
    cfg.validation.every = 6
    cfg.validation.prompts = ["a red circle"]
    cfg.launch.cpu, cfg.launch.num_processes = True, 2
    cfg.launch.distributed = "fsdp"
    return cfg


@pytest.mark.slow
def test_fsdp_full_fine_tune_on_two_cpu_processes_resumes_and_loads(tmp_path: Path,
                                                                    tiny_workspace: Path):
    from diffusers import StableDiffusionPipeline
    from safetensors.torch import load_file

    reference = _fsdp_config(tmp_path / "a", 8)
    assert _start(reference, tiny_workspace).wait(timeout=600) == "done", \
        (Path(reference.output.dir) / "train.log").read_text()[-3000:]
    ref_dir = Path(reference.output.dir)
    log = (ref_dir / "train.log").read_text()
    held = re.search(r"sharded over 2 processes \(FSDP2\); this one holds (\d+) of its "
                     r"(\d+) weights", log)
    assert held, log[-3000:]
    assert int(held[1]) < 0.6 * int(held[2])  # a shard, not a copy
    curve = step_losses(ref_dir)
    assert sorted(curve) == list(range(1, 9)) and curve[8] < curve[1]
    assert {e["step"] for e in events(ref_dir) if e["type"] == "eval"} >= {6, 8}
    assert (ref_dir / "validation/step_000006/00.png").is_file()
    assert (ref_dir / "checkpoints/step_000006/trainable.safetensors").is_file()

    # model/ loads in diffusers and holds the final checkpoint's (full) weights.
    pipe = StableDiffusionPipeline.from_pretrained(str(ref_dir / "model"),
                                                   local_files_only=True)
    final = load_file(str(ref_dir / "checkpoints/step_000008/trainable.safetensors"))
    unet = pipe.unet.state_dict()
    assert set(final) == set(unet)
    assert all(torch.equal(final[k], unet[k]) for k in final)

    # A run that stops at step 5, then goes on to 8 from its checkpoint: the same curve
    # (the reference ran the evals, validation and saves under FSDP; this one saves at its
    # ends and validates nothing).
    cfg = _fsdp_config(tmp_path / "b", 5)
    cfg.train.eval_every = cfg.train.checkpoint_every = 1000  # the end's only
    cfg.validation.prompts = []
    assert _start(cfg, tiny_workspace).wait(timeout=600) == "done"
    run_dir = Path(cfg.output.dir)
    resumed = app("--config", str(run_dir / "config.toml"), "--resume", "--set",
                  "train.max_steps=8", workspace=tiny_workspace)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in (run_dir / "train.log").read_text()
    losses = step_losses(run_dir)
    for step in (6, 7, 8):
        assert losses[step] == pytest.approx(curve[step], rel=1e-4, abs=1e-5), step

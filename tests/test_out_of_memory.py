"""A GPU that runs out of memory ends the run with a refusal that says where and what to
change, not torch's traceback.

This CPU machine has no GPU to fill, so the real code raises torch's own
`torch.OutOfMemoryError`, with the text CUDA gives it, from the part of the run under test:
a training step, a validation round, the setup (loading and building the caches), and
the cache job's encoders and encoding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.exits import EXIT_FAILED
from tests.conftest import small_config, train_in_process

CUDA_SAYS = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
             "23.55 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process "
             "has 22.51 GiB memory in use. Of the allocated memory 21.80 GiB is allocated by "
             "PyTorch, and 0.20 GiB is reserved by PyTorch but unallocated.")
FIGURES = "(Tried to allocate 2.00 GiB; GPU 0 has a total capacity of 23.55 GiB of which " \
          "1.02 GiB is free)"


def raise_it(*args: object, **kwargs: object) -> None:
    """What torch raises when CUDA has no room left."""
    raise torch.OutOfMemoryError(CUDA_SAYS)


def run_out_of_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part: str,
                      capsys: pytest.CaptureFixture[str]) -> tuple[int, str, dict, str]:
    """Train 3 steps with `part` raising torch's error; (exit, error event, status, stdout)."""
    from core.config import save_config
    from core.models.registry import get_family

    cfg = small_config(tmp_path, images=2)
    cfg.launch.cpu = True
    cfg.train.max_steps, cfg.train.eval_every, cfg.train.checkpoint_every = 3, 100, 100
    cfg.validation.every, cfg.validation.steps, cfg.validation.prompts = 2, 1, ["a"]
    if part == "step":
        family = type(get_family("sd15"))
        real, calls = family.predict, []

        def second_fails(self: object, *args: object, **kwargs: object) -> object:
            calls.append(1)
            if len(calls) == 2:
                raise_it()
            return real(self, *args, **kwargs)

        monkeypatch.setattr(family, "predict", second_fails)
    elif part == "validation":
        monkeypatch.setattr("core.train.loop.generate_validation_images", raise_it)
    else:
        monkeypatch.setattr("core.train.setup.prepare_data", raise_it)
    save_config(cfg, tmp_path / "config.toml")
    code = train_in_process(tmp_path / "config.toml", tmp_path)
    run_dir = Path(cfg.output.dir)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    error = next(e["message"] for e in events if e["type"] == "error")
    status = json.loads((run_dir / "status.json").read_text())
    return code, error, status, capsys.readouterr().out


@pytest.mark.parametrize("part, where, first_advice", [
    ("step", "in training step 2", 'model.quantize = "int8"'),
    ("validation", "in validation at step 2", "a lower validation.resolution"),
    ("setup", "while loading the model or building the caches", 'model.quantize = "int8"'),
])
def test_running_out_of_gpu_memory_says_where_and_what_to_change(
        tmp_path, monkeypatch, capsys, part, where, first_advice):
    code, error, status, out = run_out_of_memory(tmp_path, monkeypatch, part, capsys)

    assert code == EXIT_FAILED
    assert error == status["reason"]
    assert error.startswith(f"the GPU ran out of memory {where} {FIGURES}; to need less: "
                            f"{first_advice}, "), error
    assert "train.gradient_checkpointing = true" in error
    assert f"error: {error}" in out and "Traceback" not in out


@pytest.mark.parametrize("patched", ["core.models.modules.move_encoders",
                                     "core.cache.stage.build_caches"])
def test_the_cache_job_says_so_too(tmp_path, monkeypatch, capsys, patched):
    """The UI's "Build caches" job: its encoders arriving on the GPU, then encoding."""
    from core.cache.main import main
    from core.config import save_config

    cfg = small_config(tmp_path, images=2)
    cfg.launch.cpu = True
    save_config(cfg, tmp_path / "config.toml")
    monkeypatch.setattr(patched, raise_it)

    code = main(["--config", str(tmp_path / "config.toml"), "--workspace", str(tmp_path)])

    out = capsys.readouterr().out
    assert code == EXIT_FAILED
    assert f"error: the GPU ran out of memory while building the caches {FIGURES}" in out
    assert "a lower resolution for the datasets" in out and "Traceback" not in out

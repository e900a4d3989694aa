"""What the logs show a user: progress bars as their last state without control codes,
a tenth of the step lines in the UI's log, and no advisories that ask nothing of them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from core.runs.follow import RunFollower
from core.runs.progress import format_step_line
from core.runs.tail import last_lines


def step_lines(first: int, last: int, max_steps: int) -> str:
    return "".join(format_step_line(s, max_steps, 0.5, 1e-4, 2.0, 10.0) + "\n"
                   for s in range(first, last + 1))


def test_a_tqdm_bar_shows_its_last_state_without_escape_codes(tmp_path):
    log = tmp_path / "cache.log"
    log.write_text("\rLoading weights:   0%|          | 0/52 [00:00<?, ?it/s]"
                   "\rLoading weights: 100%|\u2588\u2588\u2588| 52/52 [00:00<00:00]\r\x1b[A\n"
                   "\x1b[32mvae cache: 8 image(s)\x1b[0m\r\n")
    assert last_lines(log) == ["Loading weights: 100%|\u2588\u2588\u2588| 52/52 [00:00<00:00]",
                               "vae cache: 8 image(s)"]


def test_the_ui_log_keeps_a_tenth_of_the_step_lines_and_the_newest(tmp_path):
    (tmp_path / "train.log").write_text("loading\neval step 0: loss 0.5\n"
                                        + step_lines(1, 37, 100))
    f = RunFollower(tmp_path, log_offset=0).poll()
    text = f.log_text().splitlines()
    steps = [line.split()[1] for line in text if line.startswith("step ")]
    assert steps == ["10/100", "20/100", "30/100", "37/100"], text
    assert text[:2] == ["loading", "eval step 0: loss 0.5"]
    with open(tmp_path / "train.log", "a") as fh:
        fh.write(step_lines(38, 41, 100) + "checkpoint saved: step_000041\n"
                 + step_lines(42, 100, 100) + "training done\n")
    text = f.poll().log_text().splitlines()
    steps = [line.split()[1] for line in text if line.startswith("step ")]
    assert steps == [f"{n}/100" for n in range(10, 101, 10)], text
    assert text[-1] == "training done" and "checkpoint saved: step_000041" in text


def test_library_advisories_are_dropped_and_other_warnings_kept():
    from core.notices import quiet_library_notices

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.seen.append(record.getMessage())

    quiet_library_notices()
    quiet_library_notices()  # twice (trainer then caching in one process): one filter
    names = ("transformers.utils.import_utils", "diffusers.quantizers.torchao.torchao_quantizer")
    handlers = {name: Keep() for name in names}
    # Another test in this process may have set transformers' verbosity to errors (the
    # app does): this test is about the filters, so the loggers pass warnings here.
    levels = {name: logging.getLogger(name).level for name in names}
    for name, handler in handlers.items():
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        logging.getLogger(names[0]).warning(
            "`CLIPImageProcessor` requires torchvision (not installed); falling back to "
            "`CLIPImageProcessorPil` for backward compatibility.")
        logging.getLogger(names[0]).warning("Could not import module 'Foo'")
        logging.getLogger(names[1]).warning(
            "Unable to import `torchao` Tensor objects. This may affect loading checkpoints")
        logging.getLogger(names[1]).error("a real torchao error")
    finally:
        for name, handler in handlers.items():
            logging.getLogger(name).removeHandler(handler)
            logging.getLogger(name).setLevel(levels[name])
    assert handlers[names[0]].seen == ["Could not import module 'Foo'"]
    assert handlers[names[1]].seen == ["a real torchao error"]
    assert len(logging.getLogger(names[0]).filters) == 1


@pytest.mark.slow
def test_library_notices_are_dropped_in_a_fresh_process():
    """bitsandbytes (requirements.txt) logs at import, on CPUs with AVX-512 BF16, that an
    optional hub kernel is missing; the launched programs import it through diffusers.
    diffusers' Chroma transformer builds a FluxPosEmbed that diffusers deprecates: every
    Chroma check and run printed a FutureWarning about diffusers' own code."""
    import subprocess
    import sys

    code = ("from core.notices import quiet_library_notices\n"
            "quiet_library_notices()\n"
            "import logging, warnings\n"
            "logging.getLogger('bitsandbytes.backends.cpu.ops').warning("
            "'Failed to load CPU gemm_4bit_forward from kernels-community: x')\n"
            "logging.getLogger('bitsandbytes.backends.cpu.ops').warning('kept')\n"
            "import bitsandbytes\n"
            "from diffusers.models.transformers.transformer_chroma import "
            "ChromaTransformer2DModel\n"
            "ChromaTransformer2DModel(num_layers=1, num_single_layers=1, attention_head_dim=8,"
            " num_attention_heads=2, axes_dims_rope=(2, 2, 4), joint_attention_dim=16,"
            " approximator_num_channels=8, approximator_hidden_dim=16)\n"
            "warnings.warn('another FutureWarning', FutureWarning)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert "Failed to load CPU gemm_4bit_forward" not in done.stderr
    assert "kept" in done.stderr
    assert "FluxPosEmbed" not in done.stderr
    assert "another FutureWarning" in done.stderr

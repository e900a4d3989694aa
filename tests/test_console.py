"""The headless CLI's progress display: the pure formatting, both consoles, and the real
`app.py --no-ui` through a pipe and through a pseudo-terminal."""

from __future__ import annotations

import io
import os
import re
import select
import signal
import struct
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, small_config

from core.config import save_config
from core.runs.console import CLEAR_LINE, LiveConsole, LogConsole, make_console
from core.runs.progress import (
    format_duration,
    format_progress,
    format_step_line,
    is_step_line,
    parse_step_line,
    report_every,
    strip_escapes,
)
from core.runs.tail import collapse_cr

PROGRESS = re.compile(r"^step \d+/\d+ ")  # the console's line (and the trainer's)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def step_line(step: int, max_steps: int = 400, loss: float = 0.5) -> str:
    return format_step_line(step, max_steps, loss, 1e-3, 2.0 if step > 1 else None,
                            (max_steps - step) / 2 if step > 1 else None)


# ---------------------------------------------------------------- pure functions


def test_step_lines_round_trip_and_other_lines_are_not_steps() -> None:
    parsed = parse_step_line(format_step_line(12, 400, 0.51234, 2.5e-3, 1.31, 297.0))
    assert parsed is not None and (parsed.step, parsed.max_steps) == (12, 400)
    assert parsed.loss == pytest.approx(0.5123) and parsed.lr == pytest.approx(2.5e-3)
    assert parsed.it_s == pytest.approx(1.31) and parsed.eta_s == 297.0
    first = parse_step_line("step 1/30 loss 1.0797 lr 5.00e-04 0.00 it/s eta ?")
    assert first is not None and first.it_s is None and first.eta_s is None
    for other in ("eval step 10: loss 0.8292 loss_shuffled 0.8292",
                  "validation images for step 15: /runs/demo/validation/step_000015",
                  "checkpoint saved: /runs/demo/checkpoints/step_000015",
                  "step 1 loss 1.0000", "stopped at step 40/100", ""):
        assert not is_step_line(other), other


def test_report_every_gives_ten_to_twenty_lines_at_round_steps() -> None:
    assert [report_every(n) for n in (1, 8, 30, 400, 1234, 1999, 20000)] == [
        1, 1, 3, 40, 100, 100, 2000]
    for max_steps in range(10, 5000, 7):
        every = report_every(max_steps)
        assert 10 <= max_steps // every < 20, max_steps


def test_progress_line_fits_the_width_and_says_everything() -> None:
    text = format_progress(120, 400, 0.512, 1.31, 192.4, 100.0, loss_avg=0.548)
    assert text == ("step 120/400 (30%) loss 0.5120 (avg 0.5480), 1.31 it/s, eta 3m12s, "
                    "elapsed 1m40s")
    wide = format_progress(120, 400, 0.512, 1.31, 192.4, 100.0, width=100)
    assert len(wide) <= 100 and "[=========>" in wide and " 30% loss 0.5120" in wide
    narrow = format_progress(120, 400, 0.512, None, None, 5.0, width=40)
    assert len(narrow) <= 40 and "[" not in narrow and narrow.startswith("step 120/400  30%")
    assert "? it/s, eta ?" in format_progress(1, 400, 1.0, None, None, 0.0)
    done = format_progress(400, 400, 0.3, 2.0, 0.0, 3725.0, width=120)
    assert "[" + "=" * 30 + "] 100%" in done and "elapsed 1h02m" in done


def test_durations_and_escape_codes() -> None:
    assert [format_duration(s) for s in (None, 0.4, 42, 185, 3725)] == [
        "?", "0s", "42s", "3m05s", "1h02m"]
    assert strip_escapes("text cache:   0%| 0/24\x1b[A") == "text cache:   0%| 0/24"
    assert strip_escapes("\x1b[1;31merror\x1b[0m: x\x1b[K") == "error: x"


# ---------------------------------------------------------------- the consoles


def test_log_console_prints_every_nth_step_the_first_the_last_and_all_else() -> None:
    out: list[str] = []
    console = LogConsole(out.append, clock=Clock())
    for step in range(1, 401):
        console.line(step_line(step))
        if step % 50 == 0:
            console.line(f"eval step {step}: loss 0.5 loss_shuffled 0.6")
    console.line("\x1b[Ktraining done")
    console.close()
    steps = [int(line.split()[1].split("/")[0]) for line in out if PROGRESS.match(line)]
    assert steps == [1, *range(40, 401, 40)]
    assert sum(line.startswith("eval step") for line in out) == 8
    assert out[-1] == "training done" and out[-2].startswith("eval step 400")
    assert out[-3].startswith("step 400/400 (100%) loss 0.5000 (avg 0.5000)")


def test_log_console_shows_where_a_stopped_run_ended() -> None:
    out: list[str] = []
    console = LogConsole(out.append, clock=Clock())
    for step in range(1, 58):
        console.line(step_line(step))
    console.line("stop requested")
    console.close()
    assert [line.split()[1] for line in out if PROGRESS.match(line)] == [
        "1/400", "40/400", "57/400"]
    assert out.index("stop requested") == 2  # the last step comes after: where it ended


def shown_rows(raw: str) -> list[str]:
    """What a terminal shows: each row's last carriage-return segment, escapes removed."""
    return [strip_escapes(collapse_cr(row)) for row in raw.replace("\r\n", "\n").split("\n")]


def test_live_console_redraws_one_line_and_prints_other_lines_above_it() -> None:
    stream, clock = io.StringIO(), Clock()
    console = LiveConsole(stream, columns=lambda: 100, clock=clock)
    console.line("=== run started")
    for step in range(1, 31):
        console.line(step_line(step, 30))
        if step % 10 == 0:
            console.line(f"eval step {step}: loss 0.5 loss_shuffled 0.6")
        clock.now += 1
        console.refresh("")
    console.line("training done")
    console.close()
    raw = stream.getvalue()
    assert raw.count("\n") == 6  # five lines and the finished bar: no newline per step
    assert raw.count(CLEAR_LINE + "step ") >= 30
    rows = shown_rows(raw)
    assert rows[:4] == ["=== run started", "eval step 10: loss 0.5 loss_shuffled 0.6",
                        "eval step 20: loss 0.5 loss_shuffled 0.6",
                        "eval step 30: loss 0.5 loss_shuffled 0.6"]
    assert rows[4] == "training done" and rows[6:] == [""]
    assert rows[5].startswith("step 30/30 [") and "elapsed 30s" in rows[5]
    assert all(len(row) < 100 for row in rows)


def test_live_console_shows_a_bar_the_child_is_drawing_without_its_escapes() -> None:
    stream = io.StringIO()
    console = LiveConsole(stream, columns=lambda: 60, clock=Clock())
    console.refresh("vae cache:  28%|██▊       | 20/72 [00:00<00:00, 181.98entry/s]\x1b[A")
    console.line("vae cache: 100%|██████████| 72/72 [00:00<00:00, 94.61entry/s]")
    console.close()
    raw = stream.getvalue()
    assert "\x1b[A" not in raw and raw.startswith(CLEAR_LINE + "vae cache:  28%")
    assert shown_rows(raw) == ["vae cache: 100%|██████████| 72/72 [00:00<00:00, "
                               "94.61entry/s]", ""]


def test_make_console_picks_by_terminal() -> None:
    assert isinstance(make_console(io.StringIO()), LogConsole)
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            assert isinstance(make_console(tty), LiveConsole)
    finally:
        os.close(master)
        os.close(slave)


# ---------------------------------------------------------------- the real command

STEPS = 20
# The terminal's line is redrawn at each poll (every 0.5 s): 20 tiny steps can end within
# two polls on a quiet machine, too few to see it redrawn.
TERMINAL_STEPS = 60


def run_config(tmp: Path, steps: int = STEPS) -> Path:
    cfg = small_config(tmp, images=6)
    cfg.train.max_steps = steps
    cfg.train.eval_every = 10
    cfg.train.eval_images = 2
    cfg.train.checkpoint_every = 1000
    cfg.validation.every = 1000  # once, at the end: a line between the steps and the end
    cfg.launch.cpu = True
    save_config(cfg, tmp / "run.toml")
    return tmp / "run.toml"


def terminal_env() -> dict[str, str]:
    """The environment of a command typed in a terminal: its width is the terminal's.
    pytest-xdist's workers export COLUMNS=80, which would override the pty's 120."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return {**env, "TERM": "xterm"}


def command(config: Path, workspace: Path) -> list[str]:
    return [PYTHON, str(REPO / "app.py"), "--no-ui", "--config", str(config),
            "--workspace", str(workspace)]


@pytest.mark.slow
def test_headless_run_through_a_pipe_prints_a_bounded_number_of_step_lines(
        tmp_path: Path, tiny_workspace: Path) -> None:
    done = subprocess.run(command(run_config(tmp_path), tiny_workspace), cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    steps = [line for line in lines if PROGRESS.match(line)]
    assert len(steps) == 1 + STEPS // report_every(STEPS), steps  # the first, every 2nd
    assert steps[0].startswith(f"step 1/{STEPS} (5%)")
    assert steps[-1].startswith(f"step {STEPS}/{STEPS} (100%) loss ")
    assert "it/s, eta" in steps[-1] and "elapsed" in steps[-1]
    assert any(line.startswith("eval step 10:") for line in lines)
    assert "\r" not in done.stdout and "\x1b" not in done.stdout
    log = (tmp_path / "runs/run/train.log").read_text(encoding="utf-8")
    assert sum(is_step_line(line) for line in log.splitlines()) == STEPS  # the log is whole


def read_all(fd: int, proc: subprocess.Popen, timeout: float) -> bytes:
    """Everything the child writes to the terminal until it closes it."""
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


@pytest.mark.slow
def test_headless_run_in_a_terminal_redraws_one_progress_line(
        tmp_path: Path, tiny_workspace: Path) -> None:
    import fcntl
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(command(run_config(tmp_path, TERMINAL_STEPS), tiny_workspace),
                            cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=terminal_env())
    os.close(slave)
    try:
        raw = read_all(master, proc, timeout=600).decode("utf-8", "replace")
        assert proc.wait(timeout=60) == 0, raw[-4000:]
    finally:
        os.close(master)
        if proc.poll() is None:  # a failed assertion: stop the run cleanly, then for sure
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    rows = shown_rows(raw)
    bars = [row for row in rows if PROGRESS.match(row)]
    assert len(bars) == 1 and bars[0].startswith(
        f"step {TERMINAL_STEPS}/{TERMINAL_STEPS} ["), rows
    redrawn = set(re.findall(r"\x1b\[Kstep (\d+)/", raw))
    assert len(redrawn) >= 3, "the line is redrawn as the steps go"
    assert any(row.startswith("eval step 10:") for row in rows)
    assert rows.index(bars[0]) < rows.index(next(r for r in rows if r.startswith("run done")))


def test_cache_builder_draws_one_bar_at_a_time(capsys: pytest.CaptureFixture) -> None:
    from core.cache.main import _progress_sink

    report, bars = _progress_sink(None, show_bar=True, process=0)
    report("vae", 4, 8)
    report("vae", 8, 8)
    report("text", 3, 3)
    for bar in bars.values():
        bar.close()
    drawn = capsys.readouterr().err
    assert "text cache: 100%" in drawn and "vae cache: 100%" in drawn
    assert "\x1b[" not in drawn, "a second open bar is drawn with cursor-up codes"

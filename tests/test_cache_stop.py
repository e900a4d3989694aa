"""Stop build stops a cache build (issue 40 item 5), also when the app was started in the
background: a shell starts a background job with SIGINT ignored, its children inherit
that, and the build used to ignore the Stop button's SIGINT, run on through the 10 s
grace and end "done" (or be killed, its status speaking of a checkpoint)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from conftest import small_config

from core import ops
from core.runs.final_state import decide_final_state
from core.runs.status import RunStatus, read_status

IMAGES = 400


def _started_as_from_a_background_shell(cfg, workspace: Path):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `app.py &` gets
    try:
        return ops.start_cache(cfg, workspace)
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_stop_build_stops_a_build_whose_app_ignores_sigint(tmp_path: Path) -> None:
    from safetensors import safe_open

    cfg = small_config(tmp_path, images=IMAGES)
    job = _started_as_from_a_background_shell(cfg, tmp_path)
    try:
        deadline = time.monotonic() + 180
        while job.poll() is None and time.monotonic() < deadline:
            if job.progress.kinds.get("vae") and job.progress.kinds["vae"].done:
                break
            time.sleep(0.05)
        assert job.poll() is None, "the build ended before it could be stopped"
        began = time.monotonic()
        # A long grace, so a loaded machine's slow stop is not mistaken for the wait: a
        # build that ignores the stop sits out all 30 s (and is forced).
        state = job.stop(grace_s=30.0)
        took = time.monotonic() - began
    finally:
        if job.poll() is None:
            job.stop(grace_s=1.0)
    status = read_status(job.folder.root)
    assert state == "stopped" and not status.stop_forced, status
    assert took < 20, f"{took:.1f} s: it waited for the grace period"
    job.poll()
    assert job.progress.kinds["vae"].done < IMAGES
    assert "checkpoint" not in status.reason
    assert any("stopped by the user: the entries written so far are kept" in line
               for line in job.log_lines(20))
    entries = list(Path(cfg.datasets[0].vae_cache).rglob("*.safetensors"))
    assert 0 < len(entries) < IMAGES
    for entry in entries:  # each entry whole: a build again reads and keeps them
        with safe_open(str(entry), "pt") as fh:
            assert "latents" in fh.keys()  # noqa: SIM118


def test_a_killed_cache_build_does_not_speak_of_checkpoints() -> None:
    running = RunStatus.from_dict({"state": "running"})
    state, reason = decide_final_state(-signal.SIGKILL, running, stop_requested=True,
                                       forced=True, kind="cache")
    assert state == "stopped"
    assert reason.endswith("so the cache entries written so far are kept, each whole")
    _, failed = decide_final_state(1, running, kind="cache")
    assert failed.startswith("the cache build process exited with code 1")


def test_the_launched_programs_take_sigint_even_when_started_ignoring_it() -> None:
    """core.exits.stop_signals_interrupt, which the cache build and captioning call:
    SIGINT and SIGTERM raise KeyboardInterrupt even under an inherited SIG_IGN."""
    import subprocess
    import sys

    from conftest import REPO

    code = ("import os, signal\n"
            "from core.exits import stop_signals_interrupt\n"
            "stop_signals_interrupt()\n"
            "for sig in (signal.SIGINT, signal.SIGTERM):\n"
            "    try:\n"
            "        os.kill(os.getpid(), sig)\n"
            "        signal.pause()\n"
            "    except KeyboardInterrupt as exc:\n"
            "        print('interrupted by', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.stdout.split("\n")[:2] == ["interrupted by SIGINT", "interrupted by SIGTERM"], \
        done.stdout + done.stderr


@pytest.mark.slow
def test_a_ctrl_c_as_a_headless_cache_build_starts_stops_the_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A Ctrl-C that lands just after the build's job started (inside ops.start_cache)
    used to end `app.py --stage cache` with "stopped before a run started" and leave the
    build going in its own session; it now stops that build."""
    import os

    from core.exits import EXIT_STOPPED
    from core.headless import stage_cache

    cfg = small_config(tmp_path, images=IMAGES)
    started, start_cache = [], ops.start_cache

    def start_then_ctrl_c(*args, **kwargs):
        started.append(start_cache(*args, **kwargs))
        os.kill(os.getpid(), signal.SIGINT)
        return started[-1]

    monkeypatch.setattr(ops, "start_cache", start_then_ctrl_c)
    try:
        code = stage_cache(cfg, tmp_path, ops.check(cfg, tmp_path))
    finally:
        for job in started:
            if job.poll() is None:
                job.stop(grace_s=1.0)
    (job,) = started
    assert code == EXIT_STOPPED, capsys.readouterr().out[-2000:]
    assert read_status(job.folder.root).state == "stopped"
    assert "stopping:" in capsys.readouterr().out


def test_stop_build_after_a_finished_build_says_there_is_nothing_to_stop() -> None:
    """Issue 54 item 4: *Stop build* after a build ended said "cache build done", as if
    it had done something; it says nothing runs (and how the last one ended), and stops
    nothing; a live build is stopped and said so."""
    from types import SimpleNamespace

    from ui.tab_cache import stop_message

    class Job:
        def __init__(self, state: str | None) -> None:
            self.state, self.stops, self.log_path = state, 0, Path("ws/.cache-jobs/1/cache.log")

        def poll(self) -> str | None:
            return self.state

        def stop(self) -> str:
            self.stops += 1
            return "stopped"

    assert "no cache build is running; nothing to stop" in stop_message(
        SimpleNamespace(cache_job=None))
    done = Job("done")
    text = stop_message(SimpleNamespace(cache_job=done))
    assert "no cache build is running (the last one ended done; log: " in text, text
    assert "nothing to stop" in text and done.stops == 0
    live = Job(None)
    assert "cache build stopped: the entries written so far are kept" in stop_message(
        SimpleNamespace(cache_job=live))
    assert live.stops == 1

"""The run manager: accelerate command, start/stop of real process groups, registry, tails.

Process tests run tests/fixtures/fake_trainer.py (a real program that behaves like the
trainer towards the manager), once through a real `accelerate launch`.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import free_port

from core.config import Config, DatasetConfig, load_config
from core.runs import (
    EventTail,
    LaunchSpec,
    LogTail,
    RunDirError,
    RunStartError,
    attach,
    build_accelerate_command,
    exit_code_for_state,
    follow_run,
    format_command,
    list_runs,
    prepare_run_dir,
    read_status,
    reconcile_runs,
    start_run,
    stop_run,
    write_status,
)
from core.runs.command import PROJECT_ROOT
from core.runs.pids import is_running

FAKE = str(PROJECT_ROOT / "tests" / "fixtures" / "fake_trainer.py")


def make_cfg(**launch) -> Config:
    cfg = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a")])
    cfg.output.dir = "runs/demo"
    for key, value in launch.items():
        setattr(cfg.launch, key, value)
    return cfg


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def direct_spec(run_dir: Path, workspace: Path, *extra: str) -> LaunchSpec:
    """The fake trainer run by plain python (no accelerate start-up cost)."""
    argv = [sys.executable, FAKE, "--config", str(run_dir / "config.toml"),
            "--workspace", str(workspace), *extra]
    return LaunchSpec(argv=argv, env={"PYTHONPATH": str(PROJECT_ROOT)}, workspace=workspace)


def wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def pids_in(pid_file: Path) -> dict[str, int]:
    return {line.split()[0]: int(line.split()[1])
            for line in pid_file.read_text().splitlines() if line.strip()}


def events_of(run_dir: Path) -> list[dict]:
    return EventTail(run_dir / "events.jsonl").read()


@pytest.fixture
def reaper():
    """Kill whatever a failing test left running: handles' processes and listed pids."""
    handles: list = []
    pid_files: list[Path] = []
    yield handles, pid_files
    for handle in handles:
        for pid in handle.processes():
            os.kill(pid, signal.SIGKILL)
        if handle.popen is not None:
            handle.popen.wait(timeout=10)
    for pid_file in pid_files:
        for pid in pids_in(pid_file).values():
            if is_running(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- command


def test_cpu_multi_process_uses_multi_gpu_and_accelerate_use_cpu(tmp_path):
    cfg = make_cfg(cpu=True, num_processes=2)
    spec = build_accelerate_command(cfg, tmp_path / "run", tmp_path, resume="latest")
    argv = spec.argv
    assert argv[:3] == [sys.executable, "-m", "core.runs.accelerate_launch"]
    assert "--multi_gpu" in argv and "--cpu" not in argv
    assert spec.env["ACCELERATE_USE_CPU"] == "1"
    assert flag(argv, "--num_processes") == "2"
    assert flag(argv, "--mixed_precision") == "no"
    assert flag(argv, "--dynamo_backend") == "no"
    assert flag(argv, "--module") == "core.train.main"
    assert flag(argv, "--config") == str(tmp_path / "run" / "config.toml")
    assert flag(argv, "--workspace") == str(tmp_path)
    assert flag(argv, "--resume") == "latest"
    # trainer arguments come after the module, launcher flags before it
    assert argv.index("--multi_gpu") < argv.index("--module") < argv.index("--config")


def test_single_cpu_process_uses_cpu_flag(tmp_path):
    spec = build_accelerate_command(make_cfg(cpu=True), tmp_path / "r", tmp_path, resume=None,
                                    script=["--module", "core.cache.main"])
    assert "--cpu" in spec.argv and "--multi_gpu" not in spec.argv
    assert "ACCELERATE_USE_CPU" not in spec.env
    assert "--resume" not in spec.argv and flag(spec.argv, "--module") == "core.cache.main"


def test_multi_machine_flags_and_total_process_count(tmp_path):
    cfg = make_cfg(num_processes=4, num_machines=2, machine_rank=1,
                   main_process_ip="10.0.0.1", main_process_port=29501)
    cfg.train.mixed_precision = "bf16"
    argv = build_accelerate_command(cfg, tmp_path, tmp_path, resume=None).argv
    assert flag(argv, "--num_processes") == "8"  # accelerate counts all machines
    assert flag(argv, "--num_machines") == "2"
    assert flag(argv, "--machine_rank") == "1"
    assert flag(argv, "--main_process_ip") == "10.0.0.1"
    assert flag(argv, "--main_process_port") == "29501"
    assert flag(argv, "--mixed_precision") == "bf16"
    assert "--multi_gpu" in argv and "--cpu" not in argv


def test_one_gpu_process_has_neither_multi_gpu_nor_cpu(tmp_path):
    argv = build_accelerate_command(make_cfg(), tmp_path, tmp_path, resume=None).argv
    assert "--multi_gpu" not in argv and "--cpu" not in argv
    assert "--machine_rank" not in argv


def test_format_command_round_trips_through_the_shell(tmp_path):
    run_dir = tmp_path / "my run's \"dir\""
    spec = build_accelerate_command(make_cfg(cpu=True, num_processes=2), run_dir, tmp_path,
                                    resume=None)
    words = shlex.split(format_command(spec))
    env_words = [w for w in words[: len(spec.env)]]
    assert dict(w.split("=", 1) for w in env_words) == spec.env
    assert words[len(spec.env):] == spec.argv


# ---------------------------------------------------------------- run folder


def test_existing_run_folder_is_refused_with_how_to_continue(tmp_path):
    cfg = make_cfg()
    run_dir = tmp_path / "runs" / "demo"
    assert prepare_run_dir(cfg, run_dir, resume=False) == []
    assert load_config(run_dir / "config.toml") == cfg
    write_status(run_dir, state="stopped", step=40, max_steps=100)
    with pytest.raises(RunDirError) as info:
        prepare_run_dir(cfg, run_dir, resume=False)
    text = str(info.value)
    assert str(run_dir) in text and "stopped at step 40/100" in text
    assert "--set output.dir=runs/demo-2" in text and "--resume" in text
    # resuming keeps the saved config and names every setting that differs from it
    changed = make_cfg()
    changed.train.max_steps = 5000
    problems = prepare_run_dir(changed, run_dir, resume=True)
    assert [p.where for p in problems] == ["train.max_steps"]
    assert load_config(run_dir / "config.toml").train.max_steps == cfg.train.max_steps


def test_resume_without_a_run_says_so(tmp_path):
    with pytest.raises(RunDirError, match="nothing to resume.*without --resume"):
        prepare_run_dir(make_cfg(), tmp_path / "empty", resume=True)


# ---------------------------------------------------------------- real processes


@pytest.mark.slow
def test_accelerate_launch_runs_to_done_with_log_command_and_events(tmp_path):
    cfg = make_cfg(cpu=True)
    run_dir = tmp_path / "runs" / "demo"
    prepare_run_dir(cfg, run_dir, resume=False)
    spec = build_accelerate_command(cfg, run_dir, tmp_path, resume=None,
                                    script=[FAKE, "--steps", "5", "--step-time", "0.01"])
    handle = start_run(spec, run_dir)
    assert handle.wait(timeout=60) == "done"
    status = read_status(run_dir)
    assert status.state == "done" and status.exit_code == 0 and status.step == 5
    assert (run_dir / "command.txt").read_text().strip() == format_command(spec)
    lines = LogTail(run_dir / "train.log").read()
    assert "step 5 loss 0.2000" in lines
    assert "progress 5/5" in lines  # the \r progress line, collapsed to what a terminal shows
    assert "fake trainer: done" in lines
    assert [e["step"] for e in events_of(run_dir) if e["type"] == "step"] == [1, 2, 3, 4, 5]
    assert [r.state for r in list_runs(tmp_path)] == ["done"]


@pytest.mark.slow
def test_a_crash_under_the_launcher_fails_the_run_with_its_code_and_error_line(tmp_path):
    """accelerate's launcher, as the run manager starts it (core/runs/accelerate_launch.py),
    hands the trainer's failure on: the launcher exits 1 and the run says why."""
    cfg = make_cfg(cpu=True)
    run_dir = tmp_path / "run"
    prepare_run_dir(cfg, run_dir, resume=False)
    spec = build_accelerate_command(cfg, run_dir, tmp_path, resume=None, script=[
        FAKE, "--steps", "5", "--crash-at", "2", "--step-time", "0"])
    handle = start_run(spec, run_dir)
    assert handle.wait(timeout=60) == "failed"
    status = read_status(run_dir)
    assert status.exit_code == 1 and "simulated crash at step 2" in status.reason


@pytest.mark.slow
def test_stop_kills_every_process_including_an_orphan_in_its_own_session(tmp_path, reaper):
    """Through accelerate: the trainer saves on SIGINT; its grandchild ignores SIGINT and
    SIGTERM and left the process group (setsid), so only the run token finds it."""
    cfg = make_cfg(cpu=True)
    run_dir = tmp_path / "run"
    pid_file = tmp_path / "pids.txt"
    pid_file.touch()
    prepare_run_dir(cfg, run_dir, resume=False)
    spec = build_accelerate_command(cfg, run_dir, tmp_path, resume=None, script=[
        FAKE, "--steps", "100000", "--step-time", "0.05", "--stubborn",
        "--stubborn-new-session", "--pid-file", str(pid_file)])
    handle = start_run(spec, run_dir)
    reaper[0].append(handle)
    reaper[1].append(pid_file)
    wait_for(lambda: getattr(read_status(run_dir), "state", None) == "running", 60, "running")
    wait_for(lambda: "stubborn" in pid_file.read_text(), 10, "the stubborn child")
    pids = pids_in(pid_file)
    assert os.getpgid(pids["stubborn"]) != handle.pid  # not reachable through the group

    result = stop_run(run_dir, grace_s=3.0, term_grace_s=1.0, handle=handle)

    assert result.state == "stopped" and result.forced
    assert {handle.pid, pids["trainer"], pids["stubborn"]} <= set(result.pids)
    assert pids["stubborn"] in result.killed  # only SIGKILL ends it
    for pid in (handle.pid, *pids.values()):
        assert not is_running(pid), f"pid {pid} survived the stop"
    assert (run_dir / "fake_checkpoint.txt").exists()  # the trainer saved before exiting
    status = read_status(run_dir)
    assert status.state == "stopped" and status.stop_forced is True


@pytest.mark.slow
def test_stop_escalates_to_sigkill_when_the_trainer_ignores_sigint_and_sigterm(tmp_path,
                                                                              reaper):
    run_dir = tmp_path / "run"
    handle = start_run(direct_spec(run_dir, tmp_path, "--steps", "100000", "--ignore-stop"),
                       run_dir)
    reaper[0].append(handle)
    wait_for(lambda: getattr(read_status(run_dir), "state", None) == "running", 30, "running")
    t0 = time.monotonic()
    result = stop_run(run_dir, grace_s=1.0, term_grace_s=0.5, handle=handle)
    assert time.monotonic() - t0 < 10
    assert result.killed == [handle.pid] and not is_running(handle.pid)
    assert handle.popen.returncode == -signal.SIGKILL
    status = read_status(run_dir)
    assert status.state == "stopped" and "was killed" in status.reason


def test_crash_is_reported_failed_with_the_error_line(tmp_path):
    run_dir = tmp_path / "run"
    handle = start_run(direct_spec(run_dir, tmp_path, "--crash-at", "3", "--step-time", "0"),
                       run_dir)
    assert handle.wait(timeout=30) == "failed"
    status = read_status(run_dir)
    assert status.exit_code == 1
    assert "exited with code 1" in status.reason
    assert "simulated crash at step 3" in status.reason
    errors = [e for e in events_of(run_dir) if e["type"] == "error"]
    assert len(errors) == 1 and "simulated crash" in errors[0]["message"]


def test_restarted_manager_finds_live_run_and_marks_killed_run_failed(tmp_path, reaper):
    live_dir, dead_dir = tmp_path / "runs" / "live", tmp_path / "runs" / "dead"
    live = start_run(direct_spec(live_dir, tmp_path, "--steps", "100000"), live_dir)
    dead = start_run(direct_spec(dead_dir, tmp_path, "--steps", "100000"), dead_dir)
    reaper[0].extend([live, dead])
    for d in (live_dir, dead_dir):
        wait_for(lambda d=d: getattr(read_status(d), "state", None) == "running", 30, "running")
    with pytest.raises(RunDirError, match="still going"):  # even when resuming
        prepare_run_dir(make_cfg(), live_dir, resume=True)
    with pytest.raises(RunStartError, match="still going"):
        start_run(direct_spec(live_dir, tmp_path), live_dir)
    os.killpg(dead.pid, signal.SIGKILL)  # e.g. the OOM killer; status.json says running
    dead.popen.wait()

    # A "restarted UI": nothing but the workspace path.
    runs = {r.run_dir: r for r in list_runs(tmp_path)}
    assert runs[live_dir].alive and runs[live_dir].state == "running"
    assert runs[live_dir].pid == live.pid and "fake_trainer.py" in runs[live_dir].command
    assert not runs[dead_dir].alive and runs[dead_dir].state == "failed"
    assert "is gone" in runs[dead_dir].reason
    # Listing only reads: the dead run's folder still says what its trainer last wrote.
    assert read_status(dead_dir).state == "running"
    assert not any(e["type"] == "error" for e in events_of(dead_dir))
    # Reconciling is the explicit step that records it.
    reconcile_runs(tmp_path)
    dead_status = read_status(dead_dir)
    assert dead_status.state == "failed" and "is gone" in dead_status.reason
    assert any(e["type"] == "error" for e in events_of(dead_dir))
    reconcile_runs(tmp_path)  # once only: a second reconcile adds no second error
    assert sum(e["type"] == "error" for e in events_of(dead_dir)) == 1

    handle = attach(live_dir)
    assert handle is not None and handle.popen is None and attach(dead_dir) is None
    result = handle.stop(grace_s=20.0)
    assert result.state == "stopped" and not result.forced
    assert not is_running(live.pid)
    live.popen.wait(timeout=5)
    assert {r.run_dir.name: r.state for r in list_runs(tmp_path)} == {
        "live": "stopped", "dead": "failed"}
    assert stop_run(dead_dir).state == "failed"  # stopping a dead run changes nothing
    json.dumps([r.status.to_dict() for r in list_runs(tmp_path)])  # plain data for the UI


def ranks_under_the_launcher(tmp_path: Path, reaper, processes: int):
    """The fake trainer in `processes` ranks under accelerate's launcher, each rank's
    pid in the pid file once it runs: (handle, run folder, pid file)."""
    cfg = make_cfg(cpu=True, num_processes=processes)
    cfg.launch.main_process_port = free_port()
    run_dir, pid_file = tmp_path / "run", tmp_path / "pids.txt"
    pid_file.touch()
    prepare_run_dir(cfg, run_dir, resume=False)
    spec = build_accelerate_command(cfg, run_dir, tmp_path, resume=None, script=[
        FAKE, "--steps", "100000", "--pid-file", str(pid_file)])
    handle = start_run(spec, run_dir)
    reaper[0].append(handle)
    wait_for(lambda: pid_file.read_text().count("trainer") == processes, 60, "the ranks")
    return handle, run_dir, pid_file


@pytest.mark.slow
def test_two_cpu_processes_both_ranks_get_sigint_and_save(tmp_path, reaper):
    """torchrun (inside accelerate launch) starts each rank in its own session; a group
    signal would miss them. Both ranks must get SIGINT from us and stop cleanly, and the
    launcher must outlive them (no orphan, no forced kill)."""
    handle, run_dir, pid_file = ranks_under_the_launcher(tmp_path, reaper, 2)
    ranks = [int(line.split()[1]) for line in pid_file.read_text().splitlines()]
    assert all(os.getsid(pid) != handle.pid for pid in ranks)
    wait_for(lambda: getattr(read_status(run_dir), "state", None) == "running", 30, "running")

    result = stop_run(run_dir, grace_s=20.0, handle=handle)

    assert result.state == "stopped" and not result.forced and result.killed == []
    assert set(ranks) <= set(result.pids)
    assert not any(is_running(pid) for pid in [handle.pid, *ranks])
    log = (run_dir / "train.log").read_text()
    assert log.count("stop requested at step") == 2  # each rank finished its step and saved


@pytest.mark.slow
def test_leftover_process_after_a_finished_run_is_killed(tmp_path, reaper):
    """A process the trainer leaked (orphaned, ignoring SIGINT/SIGTERM) must not keep the
    run "running" or hold the GPU after the trainer finished."""
    run_dir, pid_file = tmp_path / "run", tmp_path / "pids.txt"
    pid_file.touch()
    reaper[1].append(pid_file)
    handle = start_run(direct_spec(run_dir, tmp_path, "--steps", "3", "--step-time", "0",
                                   "--stubborn", "--pid-file", str(pid_file)), run_dir)
    handle.linger_s = handle.term_grace_s = 0.5
    assert handle.wait(timeout=30) == "done"
    assert not is_running(pids_in(pid_file)["stubborn"])


def test_follow_run_echoes_the_log_and_turns_sigterm_into_a_graceful_stop(tmp_path, reaper):
    run_dir = tmp_path / "run"
    (run_dir).mkdir()
    (run_dir / "train.log").write_text("output of an earlier run\n")
    handle = start_run(direct_spec(run_dir, tmp_path, "--steps", "100000"), run_dir)
    reaper[0].append(handle)
    wait_for(lambda: (getattr(read_status(run_dir), "step", 0) or 0) >= 2, 30, "two steps")
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM))  # e.g. a scheduler
    timer.start()
    lines: list[str] = []
    state = follow_run(handle, lines.append, grace_s=20.0, poll_s=0.05)
    timer.join()
    assert state == "stopped" and exit_code_for_state(state) == 130
    assert lines[0].startswith("=== run started") and lines[1].startswith("$ ")
    assert "output of an earlier run" not in lines  # only this run's part of the log
    assert "step 1 loss 1.0000" in lines
    assert any(line.startswith("stopping: the trainer saves") for line in lines)
    assert any(line.startswith("stop requested at step") for line in lines)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handler restored


def test_a_run_being_started_is_never_read_as_failed(tmp_path, monkeypatch):
    """A reader (the UI's status poll, its reconcile) that comes while a run starts again
    in its folder, between the manager's first write and the launcher's pid, sees the
    folder as it was, not a live state without a live process: that read called a queued
    run that was starting failed, and a reconcile would have written it down."""
    import subprocess

    from core.runs import manager, registry

    run_dir = tmp_path / "runs" / "again"
    first = start_run(direct_spec(run_dir, tmp_path, "--steps", "2", "--step-time", "0"),
                      run_dir)
    assert first.wait(timeout=30) == "done"
    seen = []
    real_popen = subprocess.Popen

    def popen_after_a_read(*args, **kwargs):
        seen.append(registry.reconcile_run(registry.run_info(run_dir)).state)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(manager.subprocess, "Popen", popen_after_a_read)
    again = start_run(direct_spec(run_dir, tmp_path, "--steps", "2", "--step-time", "0"),
                      run_dir)
    assert seen == ["done"]  # the last launch's outcome, until the new launcher is known
    assert again.wait(timeout=30) == "done"
    assert not [e for e in events_of(run_dir) if e["type"] == "error"]


def test_a_program_that_cannot_start_is_reported(tmp_path):
    run_dir = tmp_path / "run"
    spec = LaunchSpec(argv=[str(tmp_path / "no-such-python"), "-m", "x"], workspace=tmp_path)
    with pytest.raises(RunStartError, match="could not start .*no-such-python"):
        start_run(spec, run_dir)
    status = read_status(run_dir)
    assert status.state == "failed" and "no-such-python" in status.reason
    assert "no-such-python" in (run_dir / "train.log").read_text()

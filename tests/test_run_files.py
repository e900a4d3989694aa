"""The run folder's files as the trainer writes them and the manager reads them: log and
event tails, status.json, and the final state decided from an exit code and the status."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from core.runs import (
    EventTail,
    LogTail,
    RunStatus,
    append_event,
    decide_final_state,
    exit_code_for_state,
    read_status,
    write_status,
)
from core.runs.folder import RunFolder

# ---------------------------------------------------------------- tails and status files


def test_log_tail_reads_new_bytes_collapses_progress_and_keeps_partial_lines(tmp_path):
    path = tmp_path / "train.log"
    tail = LogTail(path)
    assert tail.read() == []  # not there yet
    with open(path, "wb") as fh:
        fh.write(b"loading\n\rstep 1/3\rstep 2/3")
        fh.flush()
        assert tail.read() == ["loading"]
        assert tail.partial == "step 2/3"  # the live progress bar, not yet a line
        fh.write(b"\rstep 3/3\r\ndone caf\xc3")  # a UTF-8 character split across reads
        fh.flush()
        assert tail.read() == ["step 3/3"]
        fh.write(b"\xa9 \xff\n")
        fh.flush()
        assert tail.read() == ["done caf\u00e9 \ufffd"]
        assert tail.read() == []
    path.write_bytes(b"new run\n")  # truncated and rewritten: start over
    assert tail.read() == ["new run"]


def test_log_tail_from_end_skips_to_the_next_whole_line(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert LogTail(path, from_end=20).read() == ["line 998", "line 999"]


def test_event_tail_leaves_half_written_line_and_counts_bad_ones(tmp_path):
    run_dir = tmp_path
    append_event(run_dir, {"type": "step", "step": 1, "loss": float("nan")})
    tail = EventTail(run_dir / "events.jsonl")
    with open(run_dir / "events.jsonl", "a") as fh:
        fh.write('not json\n{"type": "step", "st')
    first = tail.read()
    assert [e["step"] for e in first] == [1]
    assert first[0]["loss"] is None  # NaN is written as null: strict JSON
    assert tail.bad_lines == 1
    with open(run_dir / "events.jsonl", "a") as fh:
        fh.write('ep": 2}\n')
    assert tail.read() == [{"type": "step", "step": 2}]
    with pytest.raises(ValueError, match="event type"):
        append_event(run_dir, {"type": "bogus"})


def test_status_is_merged_atomically_and_read_tolerantly(tmp_path):
    assert read_status(tmp_path) is None
    write_status(tmp_path, state="running", step=3, launcher_pid=123)
    write_status(tmp_path, step=4)
    status = read_status(tmp_path)
    assert status.state == "running" and status.step == 4
    assert status.launcher_pid == 123  # the trainer's updates keep the manager's fields
    (tmp_path / "status.json").write_text('{"state": "runn')  # a partial file
    assert read_status(tmp_path) is None
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ValueError, match="unknown run state"):
        write_status(tmp_path, state="complete")


# ---------------------------------------------------------------- final state


@pytest.mark.parametrize(
    ("rc", "status", "stop", "forced", "expected"),
    [
        (0, {"state": "running"}, False, False, "done"),
        (0, {"state": "done"}, False, False, "done"),
        (1, {"state": "running"}, False, False, "failed"),
        (1, {"state": "done"}, False, False, "failed"),  # never "complete" on a failure
        (130, {"state": "running"}, False, False, "stopped"),
        (-signal.SIGINT, None, False, False, "stopped"),
        (1, {"state": "stopped"}, True, False, "stopped"),  # launcher turns 130 into 1
        (-signal.SIGKILL, {"state": "running"}, True, True, "stopped"),
        # a user's stop the trainer never reported (it exited before writing its state)
        (1, None, True, False, "stopped"),
        (-signal.SIGTERM, {"state": "running"}, True, False, "stopped"),
        (-signal.SIGKILL, {"state": "running"}, False, False, "failed"),
        # the launcher (core/runs/accelerate_launch.py) says its child died of SIGKILL;
        # torchrun SIGTERM-ed the other rank, which wrote "stopped": a kill all the same
        (128 + signal.SIGKILL, {"state": "running"}, False, False, "failed"),
        (128 + signal.SIGKILL, {"state": "stopped"}, False, False, "failed"),
        (128 + signal.SIGKILL, {"state": "failed"}, False, False, "failed"),
        (128 + signal.SIGKILL, {"state": "running"}, True, True, "stopped"),
        (None, {"state": "running"}, False, False, "failed"),
        (1, {"state": "failed", "finalized_by": "manager"}, False, False, "failed"),
        (130, {"state": "failed", "finalized_by": "manager"}, False, False, "stopped"),
    ],
)
def test_final_state_is_decided_from_exit_code_and_trainer_status(rc, status, stop, forced,
                                                                  expected):
    typed = RunStatus.from_dict(status) if status is not None else None
    state, reason = decide_final_state(rc, typed, stop_requested=stop, forced=forced)
    assert state == expected
    if expected == "failed" and rc not in (None,) and (status or {}).get("state") == "running":
        assert ("code 1" in reason) or ("killed by signal 9 (often the out-of-memory "
                                        "killer: this machine's RAM ran out" in reason)
    if expected == "stopped" and (typed is None or typed.state != "stopped"):
        assert reason.startswith("stopped by the user")
        assert ("killed" in reason) == forced
    assert exit_code_for_state(state) == {"done": 0, "failed": 1, "stopped": 130}[state]


def test_run_folder_lists_only_complete_checkpoints_and_names_the_cache_log(tmp_path):
    folder = RunFolder(tmp_path)
    for name in ("step_000010", ".tmp-step_000020", "step_000005", "notes"):
        (folder.checkpoints / name).mkdir(parents=True)
    assert [p.name for p in folder.checkpoint_folders()] == ["step_000005", "step_000010"]
    assert folder.checkpoint(10) == folder.checkpoint_folders()[-1]
    assert folder.log.name == "train.log"
    assert RunFolder(tmp_path, kind="cache").log.name == "cache.log"
    assert not folder.holds_run()
    write_status(tmp_path, state="running")
    assert folder.holds_run()
    with pytest.raises(ValueError, match="unknown status.json field"):
        write_status(tmp_path, error="the trainer's old name for reason")


def test_job_folders_keep_the_newest_few_and_hold_their_config(tmp_path: Path) -> None:
    from core.config import Config, load_config
    from core.runs.jobs import new_job_folder

    jobs = tmp_path / ".cache-jobs"
    for name in ("20260101-000000-a", "20260102-000000-b", "20260103-000000-c"):
        (jobs / name).mkdir(parents=True)
    cfg = Config()
    cfg.train.max_steps = 7
    folder = new_job_folder(cfg, tmp_path, ".cache-jobs", "cache", keep=3)
    names = sorted(p.name for p in jobs.iterdir())
    assert names[:2] == ["20260102-000000-b", "20260103-000000-c"] and len(names) == 3
    assert folder.log.name == "cache.log" and load_config(folder.config).train.max_steps == 7


# ---------------------------------------------------------------- the step a run ended at


def _runs_table_step(run_dir: Path) -> str:
    from core.ops import run_status
    from ui.render import run_rows

    return run_rows([run_status(run_dir)], str)[0][2]


def test_a_run_that_fails_between_status_updates_shows_its_last_step(tmp_path):
    """Issue 40 item 6: status.json's step is written at most once a second, so a run that
    failed at step 10 showed step 1/20 in the Runs table while the Training tab (the
    step events) said 10/20."""
    from core.train.report import Reporter

    reporter = Reporter(tmp_path, is_main=True, max_steps=20)
    for step in range(1, 11):
        reporter.step(step, loss=0.5, lr=1e-4, epoch=0)
    assert read_status(tmp_path).step == 1  # the once-a-second update
    reporter.status("failed", reason="BadImage: cannot read file")
    assert _runs_table_step(tmp_path) == "10/20"


def test_a_killed_run_shows_the_step_of_its_last_step_event(tmp_path):
    """A trainer that could write nothing (killed): the manager takes the step from the
    events when it records how the run ended."""
    from core.runs.final_state import finalize_run

    write_status(tmp_path, state="running", step=1, max_steps=20)
    for step in range(1, 11):
        append_event(tmp_path, {"type": "step", "step": step, "loss": 0.5})
    append_event(tmp_path, {"type": "validation", "step": 10, "images": []})
    assert finalize_run(RunFolder(tmp_path), -signal.SIGKILL) == "failed"
    assert _runs_table_step(tmp_path) == "10/20"


def test_a_killed_cache_build_or_captioning_is_named_with_its_own_advice():
    """The same kill, for a job's folder: its process's name and what needs less memory
    there (no training keys for a cache build)."""
    state, reason = decide_final_state(128 + signal.SIGKILL, None, kind="cache")
    assert state == "failed" and reason.startswith(
        "the cache build process was killed by signal 9 (often the out-of-memory killer: ")
    assert "add RAM or swap space" in reason and "model." not in reason and "train." not in reason
    state, reason = decide_final_state(-signal.SIGSEGV, None, kind="caption")
    assert reason.startswith("the captioning process was killed by signal 11 (SIGSEGV)")

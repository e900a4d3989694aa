"""The run queue, downloads and deleting runs (core/runs/queue.py, core/runs/remove.py,
core.ops and the Runs tab's handlers).

The queue test launches real `accelerate launch` subprocesses of the stand-in trainer
(tests/fixtures/fake_trainer.py, seconds long); the "live" run it queues behind is a
registered run whose launcher is a `sleep`, so the test decides when it ends.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from core import ops
from core.config import Config, DatasetConfig, save_config
from core.runs.folder import RunFolder
from core.runs.pids import start_ticks
from core.runs.queue import (
    QueueEntry,
    QueueError,
    enqueued,
    load_queue,
    moved,
    queue_path,
    save_queue,
    without,
)
from core.runs.registry import RunRecord, list_runs, register_run
from core.runs.status import read_status, write_status
from tests.conftest import write_shapes

FAKE_TRAINER = "tests.fixtures.fake_trainer"


def entries(*names: str) -> list[QueueEntry]:
    return [QueueEntry(f"/ws/runs/{n}") for n in names]


def names(order: list[QueueEntry]) -> list[str]:
    return [Path(e.run_dir).name for e in order]


# ---------------------------------------------------------------- pure order functions


def test_order_functions_enqueue_once_cancel_and_move_clamped():
    order = entries("a", "b", "c")
    assert names(enqueued(order, QueueEntry("/ws/runs/d"))) == ["a", "b", "c", "d"]
    assert names(enqueued(order, QueueEntry("/ws/runs/a"))) == ["b", "c", "a"], "queued once"
    assert names(without(order, "/ws/runs/b")) == ["a", "c"]
    assert names(moved(order, "/ws/runs/c", -1)) == ["a", "c", "b"]
    assert names(moved(order, "/ws/runs/a", -1)) == ["a", "b", "c"], "already first"
    assert names(moved(order, "/ws/runs/a", 5)) == ["b", "c", "a"], "clamped to the end"
    assert names(order) == ["a", "b", "c"], "the input is not changed"
    with pytest.raises(QueueError, match="not queued"):
        moved(order, "/ws/runs/x", 1)


def test_queue_file_round_trips_and_a_corrupt_one_reads_as_empty(tmp_path: Path):
    order = [QueueEntry(str(tmp_path / "runs/a"), None, 1.5),
             QueueEntry(str(tmp_path / "runs/b"), "latest", 2.0)]
    save_queue(tmp_path, order)
    assert load_queue(tmp_path) == order
    data = json.loads(queue_path(tmp_path).read_text())
    assert data["version"] == 1 and [r["run_dir"] for r in data["runs"]] == [
        str(tmp_path / "runs/a"), str(tmp_path / "runs/b")]
    assert not list(tmp_path.glob(".*.tmp")), "written through a temp file and a rename"
    queue_path(tmp_path).write_text("{not json")
    assert load_queue(tmp_path) == []


def test_the_pending_order_drops_runs_that_no_longer_say_queued(tmp_path: Path):
    """status.json decides: an entry whose run started, ended or was cancelled elsewhere
    (or lost its folder) is not pending, whatever the file says."""
    from core.runs.queue import pending

    order = [QueueEntry(str(tmp_path / f"runs/{name}"), None, float(i))
             for i, name in enumerate(("a", "started", "b", "cancelled", "gone"))]
    for entry, state in zip(order, ("queued", "running", "queued", "cancelled"), strict=False):
        write_status(entry.run_dir, state=state)
    save_queue(tmp_path, order)
    assert [Path(e.run_dir).name for e in pending(tmp_path)] == ["a", "b"]


# ---------------------------------------------------------------- the queue, end to end


def workspace_config(workspace: Path, out: str) -> Config:
    if not (workspace / "data/a").is_dir():
        write_shapes(workspace / "data/a", 2)
    cfg = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a",
                                         resolution=64)])
    cfg.output.dir = out
    cfg.launch.cpu = True
    return cfg


def fake_live_run(workspace: Path, name: str = "live") -> tuple[Path, subprocess.Popen]:
    """A registered run whose launcher (a `sleep`) is alive: the GPU is taken."""
    run_dir = workspace / "runs" / name
    run_dir.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "600"])
    ticks = start_ticks(sleeper.pid)
    write_status(run_dir, state="running", pid=sleeper.pid, launcher_pid=sleeper.pid,
                 launcher_start=ticks, run_token="t", step=1, max_steps=100)
    register_run(workspace, RunRecord(str(run_dir), sleeper.pid, ticks, "t", time.time()))
    return run_dir, sleeper


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.slow  # real launchers queued, restarted and run: not for test-fast
def test_a_ui_launch_queues_behind_a_live_run_and_starts_after_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from ui import actions, tab_runs
    from ui.context import AppContext

    monkeypatch.setattr("core.runs.command.TRAINER_MODULE", FAKE_TRAINER)
    tab = tab_runs.RunsTab(*(object() for _ in range(16)))  # keys only: no Blocks needed
    ws = tmp_path / "ws"
    live_dir, sleeper = fake_live_run(ws)
    ctx = AppContext(ws, monitor=False)
    try:
        b = actions.launch(ctx, workspace_config(ws, "runs/b"))
        c = actions.launch(ctx, workspace_config(ws, "runs/c"))
        assert (b.handle, b.queued, c.queued) == (None, 1, 2)
        assert str(live_dir) in b.queued_behind and "running" in b.queued_behind
        assert read_status(b.run_dir).state == "queued"
        assert RunFolder(b.run_dir).config.exists(), "its folder is prepared as usual"
        states = {i.run_dir.name: i.state for i in list_runs(ws)}
        assert states == {"live": "running", "b": "queued", "c": "queued"}
        assert ops.start_next_queued(ws) is None, "nothing starts while a run is live"

        assert actions.move_queued(ctx, c.run_dir, -1) == [c.run_dir, b.run_dir]
        assert [row[:2] for row in tab_runs.queue_rows(ctx)] == [[1, "runs/c"], [2, "runs/b"]]
        confirm = tab_runs.chosen_view(ctx, tab, str(b.run_dir))[tab.confirm]
        assert "deletes runs/b" in confirm.label and confirm.value is False
        actions.cancel_queued(ctx, b.run_dir)
        assert read_status(b.run_dir).state == "cancelled"
        assert RunFolder(b.run_dir).config.exists(), "cancelling deletes nothing"
        e = actions.launch(ctx, workspace_config(ws, "runs/e"))
        assert actions.stop(ctx, e.run_dir) == "cancelled", "Stop on a queued run cancels it"
        assert ops.queued_runs(ws) == [c.run_dir]
        with pytest.raises(actions.ActionError, match="not queued.*cancelled"):
            actions.cancel_queued(ctx, b.run_dir)
    finally:
        ctx.close()

    sleeper.terminate()  # the live run ends while no app runs
    sleeper.wait()
    write_status(live_dir, state="done")
    restarted = AppContext(ws, monitor=True)  # a new app over the same workspace
    try:
        assert [Path(e.run_dir) for e in load_queue(ws)] == [c.run_dir]
        wait_for(lambda: read_status(c.run_dir).state == "done", 120,
                 "the monitor to start the queued run and see it finish")
        assert ops.queued_runs(ws) == [] and load_queue(ws) == []
        assert read_status(b.run_dir).state == "cancelled"
        assert not RunFolder(b.run_dir).log.exists(), "the cancelled run never started"
        # c wrote "done" moments before its processes exit; until they have, a launch
        # rightly waits behind it (a GPU is free only once they are gone).
        wait_for(lambda: not any(i.alive for i in list_runs(ws)), 60, "c's processes to exit")
        d = actions.launch(restarted, workspace_config(ws, "runs/d"))
        assert d.handle is not None and d.queued is None, "nothing live: it starts at once"
        assert d.handle.wait(timeout=120) == "done"
    finally:
        restarted.close()


# ---------------------------------------------------------------- deleting


def finished_run(workspace: Path, name: str, state: str = "done") -> Path:
    run_dir = workspace / "runs" / name
    save_config(workspace_config(workspace, f"runs/{name}"), RunFolder(run_dir).config)
    write_status(run_dir, state=state, step=8, max_steps=8)
    register_run(workspace, RunRecord(str(run_dir.resolve()), started_at=time.time()))
    return run_dir


def test_a_run_outside_the_workspace_lists_without_its_files(tmp_path: Path):
    """A headless run given an absolute output.dir elsewhere is in the workspace's list:
    choosing it says its files are not served, and the Runs tab still renders."""
    from ui import tab_runs
    from ui.context import AppContext

    ws = tmp_path / "ws"
    run_dir = tmp_path / "elsewhere/run"
    save_config(workspace_config(ws, str(run_dir)), RunFolder(run_dir).config)
    write_status(run_dir, state="done", step=8, max_steps=8)
    register_run(ws, RunRecord(str(run_dir.resolve()), started_at=time.time()))
    tab = tab_runs.RunsTab(*(object() for _ in range(16)))  # keys only: no Blocks needed
    ctx = AppContext(ws, monitor=False)
    try:
        view = tab_runs.chosen_view(ctx, tab, str(run_dir.resolve()))
    finally:
        ctx.close()
    assert view[tab.file].choices == []
    assert "outside the workspace" in view[tab.message]


def test_delete_needs_confirmation_refuses_live_runs_and_paths_outside(tmp_path: Path):
    ws = tmp_path / "ws"
    done = finished_run(ws, "done")
    with pytest.raises(ops.OpError, match="not deleted: confirm"):
        ops.delete_run(done, ws, confirm=False)
    assert done.is_dir()

    live_dir, sleeper = fake_live_run(ws)
    try:
        with pytest.raises(ops.OpError, match="is running; stop it"):
            ops.delete_run(live_dir, ws, confirm=True)
        assert live_dir.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    for path in (outside, ws, ws / "runs/../../elsewhere"):
        with pytest.raises(ops.OpError, match="not inside the workspace"):
            ops.delete_run(path, ws, confirm=True)
    (ws / "runs/stray").mkdir()  # inside, but no run of the registry
    with pytest.raises(ops.OpError, match="not a run of this workspace"):
        ops.delete_run(ws / "runs/stray", ws, confirm=True)
    assert (outside / "keep.txt").exists() and (ws / "runs/stray").is_dir()

    assert ops.delete_run(done, ws, confirm=True) == done.resolve()
    assert not done.exists()
    assert done.resolve() not in {i.run_dir.resolve() for i in list_runs(ws)}


# ---------------------------------------------------------------- downloads


def lora_run(ws: Path) -> Path:
    run_dir = finished_run(ws, "lora")
    folder = RunFolder(run_dir)
    folder.lora.mkdir()
    for parent in (folder.lora, folder.lora_step(4), folder.lora_step(8)):
        parent.mkdir(exist_ok=True)
        (parent / folder.lora_weights.name).write_bytes(b"diffusers " + parent.name.encode())
        (parent / "lora_kohya.safetensors").write_bytes(b"kohya " + parent.name.encode())
    return run_dir


def test_downloads_offer_the_runs_files_and_refuse_others(tmp_path: Path):
    from ui import tab_runs
    from ui.context import AppContext

    ws = tmp_path / "ws"
    run_dir = lora_run(ws).resolve()
    files = [p.relative_to(run_dir).as_posix() for p in ops.run_downloads(run_dir, ws)]
    assert files == ["config.toml", "lora/lora_kohya.safetensors",
                     "lora/pytorch_lora_weights.safetensors",
                     "lora/step_000008/lora_kohya.safetensors",
                     "lora/step_000008/pytorch_lora_weights.safetensors",
                     "lora/step_000004/lora_kohya.safetensors",
                     "lora/step_000004/pytorch_lora_weights.safetensors"]

    ctx = AppContext(ws, monitor=False)
    try:
        wanted = str(run_dir / "lora/step_000004/lora_kohya.safetensors")
        button = tab_runs.download_view(ctx, str(run_dir), wanted)
        assert button["value"] == wanted, "the run's own file, served from the workspace"
        assert Path(button["value"]).read_bytes() == b"kohya step_000004"
        from ui.actions import ActionError

        for path in ("/etc/passwd", str(run_dir / "status.json")):
            with pytest.raises(ActionError, match="not a file of the chosen run"):
                tab_runs.download_view(ctx, str(run_dir), path)
        with pytest.raises(ActionError, match="not a file of the chosen run"):
            tab_runs.download_view(ctx, "/etc", "/etc/passwd")
    finally:
        ctx.close()

    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(b"not yours")
    (run_dir / "lora/step_000004/evil.safetensors").symlink_to(secret)
    with pytest.raises(ops.OpError, match="outside the workspace"):
        ops.run_downloads(run_dir, ws)


def test_runs_tab_delete_needs_the_tick_then_deletes_and_relists(tmp_path: Path):
    from ui.app import build_app
    from ui.context import AppContext

    ws = tmp_path / "ws"
    run_dir = str(finished_run(ws, "old").resolve())
    ctx = AppContext(ws, monitor=False)
    try:
        demo = build_app(ctx)
        delete = next(f.fn for f in demo.fns.values() if f.fn and f.fn.__name__ == "delete")
        refused = delete(run_dir, False, None)  # the Delete button without the tick: said
        [(beside, text)] = refused.items()  # beside the button, nothing else changes
        assert beside.elem_id == "runs-delete-message"
        assert "I understand this deletes runs/old" in text and "nothing was deleted" in text
        assert Path(run_dir).is_dir()
        out = delete(run_dir, True, None)
        assert not Path(run_dir).exists()
        table = next(v for k, v in out.items() if getattr(k, "elem_id", "") == "runs-table")
        assert table == [], "the run list no longer shows it"
    finally:
        ctx.close()


def test_a_run_deleted_while_a_tick_reads_it_shows_as_deleted_not_as_a_failure(
        tmp_path: Path):
    """The Delete button's "was deleted" must not be hidden by a tick that was reading
    the run (a clean-clone make test saw the Training tab stay on the stale view): a
    tick whose folder goes under it says "was deleted", and Delete waits for a tick
    that is reading the followed run before it removes the folder."""
    import threading

    from ui import run_views
    from ui.app import build_app
    from ui.context import AppContext

    ws = tmp_path / "ws"
    ctx = AppContext(ws, monitor=False)
    view = run_views.RunView(*(object() for _ in range(7)))  # keys only: no Blocks needed
    try:
        run_dir = finished_run(ws, "old")
        f = run_views.follow(ctx, run_dir)
        read = f.follower.poll

        def deleted_under_the_reader():
            ops.delete_run(run_dir, ws, confirm=True)
            return read()

        f.follower.poll = deleted_under_the_reader
        out = run_views.tick(ctx, view, f)
        assert out[view.following] is None
        assert "runs/old was deleted" in out[view.progress], out[view.progress]
        assert not run_dir.exists(), "following a deleted run does not make its folder again"

        again = finished_run(ws, "again")
        demo = build_app(ctx)
        delete = next(d.fn for d in demo.fns.values() if d.fn and d.fn.__name__ == "delete")
        f = run_views.follow(ctx, again)
        f.busy.acquire()  # a tick reading it
        done: list[dict] = []
        deleting = threading.Thread(target=lambda: done.append(
            delete(str(again.resolve()), True, f)))
        deleting.start()
        deleting.join(timeout=1.0)
        assert again.is_dir() and not done, "Delete waits for the tick reading the run"
        f.busy.release()
        deleting.join(timeout=30)
        assert not again.exists() and f.deleted
        assert any("runs/again was deleted" in str(v) for v in done[0].values())
        assert run_views.changed_views(ctx, view, f) == {}, "nothing read from a gone run"
    finally:
        ctx.close()


@pytest.mark.slow
def test_the_followed_view_stays_on_the_live_run_then_moves_to_the_one_the_queue_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The UI's view logic without a browser (tests/test_ui_runs_browser.py has the
    browser's): a queued launch keeps the view; when the live run ends and the queue
    starts the queued one, the next tick follows it, says so, and the message under
    Launch no longer says "queued"."""
    from ui import actions, render, run_views
    from ui.context import AppContext

    monkeypatch.setattr("core.runs.command.TRAINER_MODULE", FAKE_TRAINER)
    view = run_views.RunView(*(object() for _ in range(7)))  # keys only: no Blocks needed
    message = object()
    ws = tmp_path / "ws"
    live_dir, sleeper = fake_live_run(ws)
    ctx = AppContext(ws, monitor=False)
    try:
        f = run_views.opened(ctx, view, live_dir)[view.following]
        queued = actions.launch(ctx, workspace_config(ws, "runs/next"))
        assert queued.queued == 1
        f.awaiting = queued.run_dir
        assert view.following not in run_views.tick(ctx, view, f, message)
        sleeper.kill()
        sleeper.wait()
        write_status(live_dir, state="failed")  # what the monitor records
        run_views.tick(ctx, view, f, message)  # sees it end
        started = ops.start_next_queued(ws)
        assert started is not None and started.run_dir == queued.run_dir
        out = run_views.tick(ctx, view, f, message)
        moved = out[view.following]
        assert moved.run_dir == queued.run_dir
        assert "runs/live ended (failed); now following runs/next" in out[view.progress]
        assert out[message] == render.message_html(
            "runs/next left the queue; the view below follows it", "info")
        assert started.handle.wait(timeout=120) == "done"
        ops.delete_run(queued.run_dir, ws, confirm=True)
        gone = run_views.tick(ctx, view, moved, message)
        assert gone[view.following] is None and "runs/next was deleted" in gone[view.progress]
    finally:
        sleeper.kill()
        ctx.close()

"""The idle page's number (ui/idle.py): it moves with whatever an idle tick would show
(a run started by the CLI, followed, ended, deleted; a run queued and cancelled) and
holds still otherwise; the watch flag says a run lives that no handle follows. The
browser side is tests/test_ui_cosmetics_browser.py's, the login tests/test_ui_serve.py's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_queue import fake_live_run

from ui import idle
from ui.context import AppContext


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(idle, "FRESH_S", 0.0)  # every read looks
    context = AppContext(tmp_path / "ws", monitor=False)  # nothing starts by itself
    try:
        yield context
    finally:
        context.close()


def test_the_number_moves_with_a_cli_run_and_holds_still_otherwise(ctx) -> None:
    changes = idle.Changes(ctx)
    first = changes.read()
    assert changes.read() == first == {"changes": first["changes"], "watch": False}
    live, sleeper = fake_live_run(ctx.workspace, "cli")
    try:
        started = changes.read()
        assert started["changes"] > first["changes"] and started["watch"], started
        assert changes.read() == started
        ctx.handle(live)  # a session follows it: its own ticks run at 1 s
        followed = changes.read()
        assert followed["changes"] > started["changes"] and not followed["watch"]
    finally:
        sleeper.kill()
        sleeper.wait()
    ended = changes.read()  # dead launcher: listed as failed
    assert ended["changes"] > followed["changes"]
    ctx.forget(live)
    forgotten = changes.read()
    shutil.rmtree(live)
    assert changes.read()["changes"] > forgotten["changes"]


def test_the_number_moves_when_a_run_is_queued_and_cancelled(ctx) -> None:
    from core.runs.queue import cancel_queued, queue_lock, queue_run

    changes = idle.Changes(ctx)
    first = changes.read()["changes"]
    run_dir = ctx.workspace / "runs" / "waiting"
    run_dir.mkdir(parents=True)
    with queue_lock(ctx.workspace):  # queue_run's caller holds it
        queue_run(ctx.workspace, run_dir, None)
    queued = changes.read()["changes"]
    assert queued > first
    cancel_queued(ctx.workspace, run_dir)  # takes the lock itself
    assert changes.read()["changes"] > queued


def test_the_page_script_asks_the_route_and_clicks_the_tick_button() -> None:
    from ui.pace import KICK_ID

    assert f"'{idle.PATH[1:]}'" in idle.POLL_JS and f"'{KICK_ID}'" in idle.POLL_JS
    assert f"{idle.POLL_S * 1000:.0f}" in idle.POLL_JS

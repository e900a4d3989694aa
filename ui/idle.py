"""The idle page's look at the workspace, outside Gradio's events.

Every Gradio event costs the page 150 to 300 ms of renderer time, whatever it does: each
status change makes Gradio's frontend re-apply the loading status of every component
that ever had one (about 300 here, the live check's inputs being the whole form), each
a walk of the whole layout. An idle tick every 10 s kept a headless Chromium at 2 to 5%
of a core with nothing running (docs/performance.md: 0.5 to 1.9% with this).

So at idle the page's timer (ui/pace.py) stops, and a small script (`POLL_JS`) asks
`GET /dt/changes` every POLL_S seconds for one number that grows whenever something an
idle tick would show changed: a run started, ended, was deleted or queued (this app's
sessions, the queue or the CLI: the run registry and the queue file are read), a cache
build or a captioning job started or ended. Only when the number moves does the script
click the hidden tick button (`Pace.kick`), which runs the same tick as the timer; the
tick sets the timer back to 1 s while anything is live. The answer holds that number and
a flag, nothing more: a shared link's visitor learns no path, name or state from it, and
it sits behind the same login as the page (`logged_in`, Gradio's own check).

A script that gets no answer (a proxy that refuses the route, a login gone stale) falls
back to the old idle pace: a tick every IDLE_S.
"""

from __future__ import annotations

import inspect
import threading
import time
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from core import ops
from ui.context import AppContext
from ui.pace import IDLE_S, KICK_ID

PATH = "/dt/changes"
POLL_S = 4.0  # 0.25 requests/s: under the idle page's 0.3 (tests/test_ui_quiet_browser.py)
FRESH_S = 1.0  # one look at the workspace answers every page asking within this


class Changes:
    """A number that grows whenever the workspace's idle-visible state changes. Shared
    by every session of one app; looks at the workspace at most every FRESH_S."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.count = 0
        self.watch = False
        self._state: tuple[Any, ...] | None = None
        self._at = float("-inf")
        self._lock = threading.Lock()

    def read(self) -> dict[str, Any]:
        """{"changes": the number, "watch": whether a run lives that only a periodic
        tick would follow (a CLI run no session opened: its lines are no change)}."""
        with self._lock:
            now = time.monotonic()
            if now - self._at >= FRESH_S:
                state, self.watch = self.look()
                if state != self._state:
                    self._state = state
                    self.count += 1
                self._at = now
            return {"changes": self.count, "watch": self.watch}

    def look(self) -> tuple[tuple[Any, ...], bool]:
        """(what an idle tick would notice, the watch flag)."""
        ctx = self.ctx
        runs = ops.list_runs(ctx.workspace)  # folders deleted drop out of it
        followed = {Path(h.run_dir).resolve() for h in ctx.live_handles()}
        jobs = tuple((job.folder.root.name, job.poll()) if job is not None else None
                     for job in (ctx.cache_job, ctx.caption_job))
        state = (tuple((str(i.run_dir), i.state, i.alive) for i in runs),
                 tuple(map(str, ops.queued_runs(ctx.workspace))), jobs, ctx.anything_live())
        watch = any(i.alive and Path(i.run_dir).resolve() not in followed for i in runs)
        return state, watch


async def logged_in(request: Request) -> bool:
    """Gradio's own login check (`get_current_user` in gradio/routes.py, which guards
    its routes but not one added to the app): its auth dependency, else the session
    cookie Gradio's /login set. Fails closed should Gradio's attributes be renamed."""
    app = request.app
    dependency = getattr(app, "auth_dependency", None)
    if dependency is not None:
        user = dependency(request)
        if inspect.isawaitable(user):
            user = await user
        return user is not None
    cookie_id, tokens = getattr(app, "cookie_id", None), getattr(app, "tokens", None)
    if cookie_id is None or not isinstance(tokens, dict):
        return False
    token = (request.cookies.get(f"access-token-{cookie_id}")
             or request.cookies.get(f"access-token-unsecure-{cookie_id}"))
    return tokens.get(token) is not None


def route(ctx: AppContext, login: bool) -> Route:
    """GET PATH for launch()'s `app_kwargs={"routes": [...]}`; `login`: the app has one."""
    changes = Changes(ctx)

    async def answer(request: Request) -> Response:
        if login and not await logged_in(request):
            return JSONResponse({"detail": "Not authenticated"}, status_code=401)
        body = await run_in_threadpool(changes.read)  # reads files: off the event loop
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    return Route(PATH, answer, methods=["GET"])


# Run once by the page's load event. Relative URL: the page may sit under a proxy's path.
# Hidden tabs ask nothing (Gradio's timer does not tick in them either) and ask at once
# when shown again.
POLL_JS = f"""() => {{
  const url = new URL({PATH[1:]!r}, document.baseURI);
  let seen = null, kicked = Date.now();
  const kick = () => {{
    kicked = Date.now();
    document.getElementById({KICK_ID!r})?.click();
  }};
  const due = () => Date.now() - kicked >= {IDLE_S * 1000:.0f};
  const look = async () => {{
    if (document.visibilityState !== 'visible') return;
    try {{
      const reply = await fetch(url, {{cache: 'no-store', credentials: 'same-origin'}});
      if (!reply.ok) throw new Error(String(reply.status));
      const now = await reply.json();
      if ((seen !== null && now.changes !== seen) || (now.watch && due())) kick();
      seen = now.changes;
    }} catch (e) {{
      if (due()) kick();
    }}
  }};
  setInterval(look, {POLL_S * 1000:.0f});
  document.addEventListener('visibilitychange', look);
  look();
}}"""

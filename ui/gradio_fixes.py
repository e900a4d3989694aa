"""A work-around for Gradio's frontend, applied to the file as the app serves it.

Gradio 6.31's status tracker (a component's spinner and elapsed time, and the page's own
"Loading..." tracker) counts the elapsed time in a requestAnimationFrame loop that only
its status effect stops. A tracker removed from the page while its status is pending
never sees the status change, and its loop runs at the display's rate for as long as the
page stays open. The page loader is always one: it is removed in the same update that
completes it, so every page kept about 10% of a core busy in headless Chromium (60
animation frames a second) with nothing running.

`PatchStatusTracker` (an ASGI middleware, given to launch() through `app_kwargs`) serves
`assets/statustracker-*.js` with that loop also ending once the tracker's element is
gone. A Gradio whose file no longer has the shapes below is served unchanged, with one
warning in the log; tests/test_ui_quiet_browser.py then fails on the idle page's frames.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

ASSET = re.compile(r"/assets/statustracker-[\w-]+\.js$")
# The loop's step: `Pe = (performance.now() - start) / 1000, W && ze()` (minified names).
TIMER = re.compile(r"(\(performance\.now\(\)-\w+\(\w+\)\)/1e3\),)(\w+)&&(\w+)\(\)")
# The tracker's element (bound with bind:this, null once it is removed), as its
# scroll-to-output effect names it.
ELEMENT = re.compile(r"\b(\w+)&&\w+\(\)&&\(\w+\.status===`pending`\|\|\w+\.status===`complete`"
                     r"\)&&\w+\(\1,\w+\.autoscroll\)")
MARK = "/*dt: the timer stops with its element*/"
_DROPPED = {b"content-length", b"etag", b"last-modified", b"cache-control"}

log = logging.getLogger(__name__)


def patch_status_tracker(source: str) -> str | None:
    """`source` with the elapsed-time loop ending once the tracker's element is gone,
    or None when this Gradio's file does not have the expected shapes."""
    timer, element = TIMER.search(source), ELEMENT.search(source)
    if timer is None or element is None:
        return None
    step = f"{timer[1]}{timer[2]}&&{element[1]}&&{timer[3]}(){MARK}"
    return source[:timer.start()] + step + source[timer.end():]


class PatchStatusTracker:
    """ASGI middleware: GET assets/statustracker-*.js answered with the patched file."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "GET"
                or not ASSET.search(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        start: Message = {}
        chunks: list[bytes] = []

        async def keep(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, keep)
        body = b"".join(chunks)
        if start.get("status") == 200:
            body = self.patched(body)
        # Always whole: no validator, so a browser never keeps an unpatched copy.
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in _DROPPED]
        headers += [(b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-cache")]
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def patched(self, body: bytes) -> bytes:
        patched = patch_status_tracker(body.decode("utf-8"))
        if patched is None:
            if not self.warned:
                log.warning("Gradio's status tracker changed shape; its idle animation loop "
                            "is not patched (ui/gradio_fixes.py)")
                self.warned = True
            return body
        return patched.encode("utf-8")

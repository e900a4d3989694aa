"""A work-around for Gradio's frontend, applied to the file as the app serves it.

Gradio 6.31's status tracker (a component's spinner and elapsed time, and the page's own
"Loading..." tracker) counts the elapsed time in a requestAnimationFrame loop that only
its status effect stops. A tracker removed from the page while its status is pending
never sees the status change, and its loop runs at the display's rate for as long as the
page stays open. The page loader is always one: it is removed in the same update that
completes it, so every page kept about 10% of a core busy in headless Chromium (60
animation frames a second) with nothing running.

`PatchGradioAssets` (an ASGI middleware, given to launch() through `app_kwargs`) serves
`assets/statustracker-*.js` with that loop also ending once the tracker's element is
gone. A Gradio whose file no longer has the shapes below is served unchanged, with one
warning in the log; tests/test_ui_quiet_browser.py then fails on the idle page's frames.

`PatchLayoutLookup` serves `assets/core-*.js` with one more: its lookup of a component in
the layout by id walked the whole layout tree (every node a Svelte proxy read) on each
call, and after every status change of every event Gradio re-applies the loading status
of each component that ever had one (about 300 here, the live check's inputs being the
whole form): 300 walks of the 362-node layout, three times an event. That walk was about
60% of the browser's CPU time to open the page (a CPU profile: `Z` in core-*.js and the
proxy's `get`), and most of an idle tick's. The patched lookup indexes the layout once
and keeps the index until the current task ends (a microtask clears it) or the layout is
replaced, so a burst of lookups walks the tree once; it finds the same node (the first
with that id, in the walk's order).

`calm_idle_queue` is the server's: Gradio's queue looks for a new event every millisecond
while it has none (and for progress to send every 10 ms), which kept about 9% of a core
busy with no page open and nothing running (0.65 CPU-s in 8 s; 0.13 with the pauses
below). A person's event now waits up to 20 ms to start, well under what a click shows.
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
CORE_ASSET = re.compile(r"/assets/core-[\w-]+\.js$")
# The layout lookup: `function Z(e,t){if(e.id===t)return e;if(e.children)for(let n of
# e.children){let e=Z(n,t);if(e)return e}return null}` (minified names).
LOOKUP = re.compile(r"function (\w+)\((\w+),(\w+)\)\{if\(\2\.id===\3\)return \2;"
                    r"if\(\2\.children\)for\(let (\w+) of \2\.children\)\{let \2=\1\(\4,"
                    r"\3\);if\(\2\)return \2\}return null\}")
# Where the layout tree changes shape (the app's first layout; a gr.render's subtree put in
# place): the index is dropped right after.
REPLACED = re.compile(r"(this\.root\.children=[^;]*?,)(?=this\.component_ids=)"
                      r"|(\b\w+\.children=\w+\.children,)(?=this\.#\w+\(\w+\)\})")
LOOKUP_MARK = "/*dt: the layout indexed once a task*/"
# `__dt_layout` holds {root, byId} for the current task; `var`: hoisted, never in its TDZ.
INDEXED_LOOKUP = (
    "var __dt_layout=null;"
    "function {name}(root,id){{"
    "if(__dt_layout===null||__dt_layout.root!==root){{"
    "const byId=new Map(),todo=[root];"
    "while(todo.length){{const node=todo.pop();"
    "if(!byId.has(node.id))byId.set(node.id,node);"
    "const kids=node.children;"
    "if(kids)for(let i=kids.length-1;i>=0;i--)todo.push(kids[i])}}"
    "__dt_layout={{root,byId}};queueMicrotask(()=>{{__dt_layout=null}})}}"
    "return __dt_layout.byId.get(id)??null}}" + LOOKUP_MARK)
_DROPPED = {b"content-length", b"etag", b"last-modified", b"cache-control"}

log = logging.getLogger(__name__)

QUEUE_IDLE_PAUSE_S = 0.02
PROGRESS_IDLE_PAUSE_S = 0.1


def patch_status_tracker(source: str) -> str | None:
    """`source` with the elapsed-time loop ending once the tracker's element is gone,
    or None when this Gradio's file does not have the expected shapes."""
    timer, element = TIMER.search(source), ELEMENT.search(source)
    if timer is None or element is None:
        return None
    step = f"{timer[1]}{timer[2]}&&{element[1]}&&{timer[3]}(){MARK}"
    return source[:timer.start()] + step + source[timer.end():]


def patch_layout_lookup(source: str) -> str | None:
    """`source` (core-*.js) with the layout lookup indexed once a task, or None when this
    Gradio's file does not have the expected shape."""
    lookup = LOOKUP.search(source)
    if lookup is None:
        return None
    indexed = INDEXED_LOOKUP.format(name=lookup[1])
    return _drop_index_where_replaced(source[:lookup.start()] + indexed + source[lookup.end():])


def _drop_index_where_replaced(source: str) -> str:
    return REPLACED.sub(lambda m: m[0] + "__dt_layout=null,", source)


# Each served asset's patch, and what is left as it was when its shape is not found.
PATCHES: tuple[tuple[re.Pattern[str], Callable[[str], str | None], str], ...] = (
    (ASSET, patch_status_tracker, "its status tracker's idle animation loop runs on"),
    (CORE_ASSET, patch_layout_lookup, "its layout lookup walks the tree on every call"),
)


class PatchGradioAssets:
    """ASGI middleware: GET of an asset in PATCHES answered with the patched file."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.warned: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        patch = next((p for p in PATCHES if p[0].search(path)), None)
        if scope["type"] != "http" or scope.get("method") != "GET" or patch is None:
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
            body = self.patched(body, patch)
        # Always whole: no validator, so a browser never keeps an unpatched copy.
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in _DROPPED]
        headers += [(b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-cache")]
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def patched(self, body: bytes, patch: tuple[re.Pattern[str], Callable[[str], str | None],
                                                 str]) -> bytes:
        asset, fix, unpatched = patch
        patched = fix(body.decode("utf-8"))
        if patched is None:
            if asset.pattern not in self.warned:
                log.warning("Gradio's frontend changed shape: %s (ui/gradio_fixes.py)",
                            unpatched)
                self.warned.add(asset.pattern)
            return body
        return patched.encode("utf-8")


def calm_idle_queue(blocks: Any) -> None:
    """Longer pauses in the idle loops of `blocks`' queue (after `blocks.queue()`); a
    Gradio without those settings is left as it is, with one warning in the log."""
    queue = getattr(blocks, "_queue", None)
    pauses = {"sleep_when_free": QUEUE_IDLE_PAUSE_S,
              "progress_update_sleep_when_free": PROGRESS_IDLE_PAUSE_S}
    if queue is None or not all(hasattr(queue, name) for name in pauses):
        log.warning("Gradio's queue changed shape: its idle loops are left as they are "
                    "(ui/gradio_fixes.py)")
        return
    for name, pause in pauses.items():
        setattr(queue, name, max(getattr(queue, name), pause))

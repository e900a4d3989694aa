"""The page's one timer: every live view (the followed run, the cache build, the
captioning job) registers its poll here, and one tick runs them all, so a tick is one
request, not one per view.

The pace follows what is live: FAST_S (1 s, the log-to-browser latency) while a run, a
cache build or a captioning job runs anywhere on the server, IDLE_S when nothing does
(an idle page makes a request every IDLE_S, so it stays quiet but still notices a run
another session or the queue started). Whatever starts something also `wake`s the
timer, so its first lines show within a second, not an idle period later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from ui.context import AppContext

FAST_S = 1.0
IDLE_S = 10.0  # a tick (a request and its reply stream) every 10 s: 0.2 requests/s


@dataclass
class _Poll:
    fn: Callable[..., Any]  # the inputs' values -> a dict of updates, or gr.skip()
    inputs: list[Any]
    outputs: list[Any]


@dataclass
class Pace:
    """Collects the polls (`add`), then `wire`s them to one timer tick."""

    ctx: AppContext
    timer: gr.Timer = field(default_factory=lambda: gr.Timer(FAST_S))
    polls: list[_Poll] = field(default_factory=list)

    def add(self, fn: Callable[..., Any], inputs: list[Any], outputs: list[Any]) -> None:
        self.polls.append(_Poll(fn, inputs, outputs))

    def wake(self) -> dict[str, Any]:
        """Event arguments (for `.then(**pace.wake())`) setting the fast pace."""
        return {"fn": lambda: gr.Timer(FAST_S), "inputs": None, "outputs": [self.timer],
                "api_visibility": "private", "show_progress": "hidden", "queue": False}

    def wire(self) -> None:
        inputs = {self.timer, *(c for p in self.polls for c in p.inputs)}
        outputs = list(dict.fromkeys(c for p in self.polls for c in p.outputs))
        self.timer.tick(self.tick, inputs, [*outputs, self.timer], api_visibility="private",
                        show_progress="hidden", concurrency_limit=None)

    def tick(self, data: dict[Any, Any]) -> Any:
        # Liveness first: a job that ends between the two is read after its last line.
        pace = FAST_S if self.ctx.anything_live() else IDLE_S
        out: dict[Any, Any] = {}
        for poll in self.polls:
            update = poll.fn(*(data[c] for c in poll.inputs))
            if isinstance(update, dict) and "__type__" not in update:  # not gr.skip()
                out.update(update)
        if data[self.timer] != pace:
            out[self.timer] = gr.Timer(pace)
        return out or gr.skip()

"""The page's one timer: every live view (the followed run, the cache build, the
captioning job) registers its poll here, and one tick runs them all, so a tick is one
request, not one per view.

The pace follows what is live: a tick every FAST_S (1 s, the log-to-browser latency)
while a run, a cache build or a captioning job runs anywhere on the server, none at idle.
An idle page's timer stops, because any Gradio event costs its renderer 150 to 300 ms
(ui/idle.py); a small script then asks the server every few seconds whether anything
changed and clicks the hidden `kick` button, which runs the same tick, when it did (a
run another session, the queue or the CLI started). Whatever starts something also
`wake`s the timer, so its first lines show within a second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from ui.context import AppContext

FAST_S = 1.0
# The idle pace: the stopped timer's value (ticks tell the paces apart by it), and how
# often ui/idle.py's script ticks when it cannot ask or a run lives that no handle follows.
IDLE_S = 10.0
KICK_ID = "dt-tick"


def timer_update(pace: float) -> gr.Timer:
    """The timer's update for `pace`: running at FAST_S, stopped at IDLE_S (explicit:
    an update sets only what it names, and the idle one stopped it)."""
    return gr.Timer(pace, active=pace == FAST_S)


@dataclass
class _Poll:
    fn: Callable[..., Any]  # the inputs' values -> a dict of updates, or gr.skip()
    inputs: list[Any]
    outputs: list[Any]


@dataclass
class Pace:
    """Collects the polls (`add`), then `wire`s them to one tick, run by the timer or by
    the hidden `kick` button (clicked by ui/idle.py's script)."""

    ctx: AppContext
    # Running at first: the page's first tick shows what it opened on (the last cache
    # build, a run started meanwhile), then stops it when nothing is live.
    timer: gr.Timer = field(default_factory=lambda: gr.Timer(FAST_S))
    kick: gr.Button = field(default_factory=lambda: gr.Button(
        "tick", visible="hidden", elem_id=KICK_ID))
    polls: list[_Poll] = field(default_factory=list)

    def add(self, fn: Callable[..., Any], inputs: list[Any], outputs: list[Any]) -> None:
        self.polls.append(_Poll(fn, inputs, outputs))

    def wake(self) -> dict[str, Any]:
        """Event arguments (for `.then(**pace.wake())`) setting the fast pace."""
        return {"fn": lambda: timer_update(FAST_S), "inputs": None, "outputs": [self.timer],
                "api_visibility": "private", "show_progress": "hidden", "queue": False}

    def wire(self) -> None:
        inputs = {self.timer, *(c for p in self.polls for c in p.inputs)}
        outputs = list(dict.fromkeys(c for p in self.polls for c in p.outputs))
        event = {"fn": self.tick, "inputs": inputs, "outputs": [*outputs, self.timer],
                 "api_visibility": "private", "show_progress": "hidden",
                 "concurrency_limit": None}
        self.timer.tick(**event)  # a tick due while one runs is dropped: the next comes
        # A kick is news the idle page learnt once (ui/idle.py): one that comes while a
        # kick's tick runs must run after it, not be dropped as a timer's tick is.
        self.kick.click(**event, trigger_mode="always_last")

    def tick(self, data: dict[Any, Any]) -> Any:
        # Liveness first: a job that ends between the two is read after its last line.
        pace = FAST_S if self.ctx.anything_live() else IDLE_S
        out: dict[Any, Any] = {}
        for poll in self.polls:
            update = poll.fn(*(data[c] for c in poll.inputs))
            if isinstance(update, dict) and "__type__" not in update:  # not gr.skip()
                out.update(update)
        if data[self.timer] != pace:
            out[self.timer] = timer_update(pace)
        return out or gr.skip()

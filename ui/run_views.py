"""Following a run: the components that show one (`RunView`: progress with the memory
line, log, loss plot, validation gallery (with a video family's validation videos, and
an edit family's control images first), reproduce command) and the updates that fill them.

The Training tab owns these components; the Runs tab and the page load open a run in
them. Each browser session follows at most one run (`Following`, kept in gr.State); a
1 s timer polls it, reading only new bytes, and sends only the views whose version
changed. Every function here returns updates keyed by component.

The view stays on what runs: when a run this session watched running ends and the queue
starts the next one, the timer moves the view to that one and says so; a followed run
whose folder was deleted is no longer shown (its last "done" would be a stale claim).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from core import ops
from core.config import load_config, prompt_text
from core.ops import (
    LIVE_STATES,
    SERIES,
    LogTail,
    RunFolder,
    RunFollower,
    format_memory,
    read_status,
    run_info,
)
from ui import actions, render
from ui.context import AppContext
from ui.run_gallery import gallery_items as gallery_items  # re-exported (tests)
from ui.run_gallery import gallery_of, grid_html

log = logging.getLogger("ui")
# How long after the followed run ended the view looks for the next run to start, once
# the queue is empty (the monitor starts the next one within a second or two).
HANDOFF_S = 15.0
LIVE_PROBE_S = 2.0  # how often the sessions look for a run started elsewhere


class MemoryWatch:
    """The run's `memory` events, read from events.jsonl as it grows. RunFollower keeps
    only what its views need, so this reads the lines itself; only lines that mention
    "memory" are parsed (a handful per run among thousands of step events)."""

    def __init__(self, run_dir: Path) -> None:
        self._tail = LogTail(RunFolder(run_dir).events)
        self.events: list[dict[str, Any]] = []
        self.version = 0

    def poll(self) -> None:
        for line in self._tail.read():
            if '"memory"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue  # EventTail (the follower) already logs a bad line
            if isinstance(event, dict) and event.get("type") == "memory":
                self.events.append(event)
                self.version += 1

    def line(self) -> str | None:
        return format_memory(self.events)


@dataclass
class Following:
    """What one session follows, and which versions of each view it has already sent."""

    follower: RunFollower
    prompts: list[str] = field(default_factory=list)
    # An edit run's validation control images, per prompt (ops.validation_controls)
    controls: list[list[Path]] = field(default_factory=list)
    control_items: list | None = field(default=None, repr=False)  # drawn once, then kept
    sent: dict[str, int] = field(default_factory=dict)
    busy: threading.Lock = field(default_factory=threading.Lock, repr=False)
    memory: MemoryWatch = field(init=False, repr=False)
    note: str = ""  # why the view shows this run (it moved here from the one that ended)
    awaiting: Path | None = None  # a run this session queued, until it leaves the queue
    live_seen: bool = False  # this session saw the run live: its end hands the view on
    ended_at: float | None = None
    # Runs already live when this one was opened: a run opened on purpose beside them
    # stays in view; one that starts later (another tab's Launch, the CLI) is followed.
    live_then: set[Path] = field(default_factory=set)
    deleted: bool = False  # set by this session's Delete, under `busy`

    def __post_init__(self) -> None:
        self.memory = MemoryWatch(self.follower.run_dir)

    @property
    def run_dir(self) -> Path:
        return self.follower.run_dir

    def changed(self, view: str, version: int) -> bool:
        if self.sent.get(view) == version:
            return False
        self.sent[view] = version
        return True


def newest_live(ctx: AppContext) -> Path | None:
    return ctx.newest_live()


def follow(ctx: AppContext, run_dir: str | Path, log_offset: int | None = None) -> Following:
    """Start following a run; a live one gets a handle so its end is recorded."""
    run_dir = Path(run_dir)
    if run_info(run_dir).alive:
        ctx.handle(run_dir)
    try:
        cfg = load_config(RunFolder(run_dir).config)
        prompts = [prompt_text(p) for p in cfg.validation.prompts]
        controls = ops.validation_controls(cfg, ctx.workspace)
    except Exception:  # an old or hand-edited config: the gallery just shows no prompts
        prompts, controls = [], []
    live = ctx.newest_live(max_age_s=LIVE_PROBE_S)
    return Following(RunFollower(run_dir, log_offset=log_offset), prompts, controls,
                     live_then={live.resolve()} if live is not None else set())


@dataclass
class RunView:
    """The components that show the followed run (and the session's `Following`)."""

    following: gr.State
    progress: gr.HTML
    log: gr.Textbox
    plot: gr.LinePlot
    gallery: gr.Gallery
    command: gr.Textbox
    tensorboard: gr.Markdown
    # The prompt x step grid of the validation images (the Training tab's; None: none).
    grid: gr.HTML | None = field(default=None, kw_only=True)

    def polled(self) -> list[gr.components.Component]:
        """What the timer updates."""
        grid = [self.grid] if self.grid is not None else []
        return [self.progress, self.log, self.plot, self.gallery, *grid]

    def components(self) -> list[gr.components.Component]:
        """Everything opening a run updates."""
        return [self.following, *self.polled(), self.command, self.tensorboard]


# ---------------------------------------------------------------- data


# Pale train curve (one noisy point a step) under the two eval curves it would hide.
SERIES_COLORS = dict(zip(SERIES, ("#93c5fd", "#16a34a", "#dc2626"), strict=True))


def loss_plot() -> gr.LinePlot:
    """The loss plot of the Training tab (the browser test builds the same one). No fixed
    height: a fixed one clips the legend below the axis down to its title."""
    return gr.LinePlot(x="step", y="loss", color="series", color_title="",
                       color_map=SERIES_COLORS, label="Loss", elem_id="loss-plot", scale=2)


def plot_frame(f: Following) -> Any:
    """The loss plot's data: every series in every frame, a series with no point yet as
    one empty (NaN) row. The browser fixes the plot's colours to the series of the
    first frame it draws and never redraws them: the trainer evaluates at step 0, so
    without the empty rows the train curve that follows had no colour and never showed."""
    import pandas as pd

    rows: list[tuple[int, float, str]] = f.follower.plot_rows()
    present = {series for _, _, series in rows}
    rows += [(0, float("nan"), series) for series in SERIES if series not in present]
    frame = pd.DataFrame(rows, columns=["step", "loss", "series"])
    # Typed, so the axes are quantitative whatever pandas infers.
    return frame.astype({"step": "int64", "loss": "float64", "series": "str"})


def drawable(rows: list[tuple[int, float, str]]) -> bool:
    """Whether some series has two points, so the line plot draws a line."""
    seen: dict[str, int] = {}
    for _, loss, series in rows:
        if loss == loss:  # not NaN
            seen[series] = seen.get(series, 0) + 1
    return any(n >= 2 for n in seen.values())


def progress_html(ctx: AppContext, f: Following) -> str:
    """The progress bar, and under it the memory line once the trainer reported one."""
    text = render.run_progress_html(f.follower.progress, ctx.relative(f.run_dir))
    if f.note:
        text = render.message_html(f.note, "info") + text
    line = f.memory.line()
    if line:
        text += f"<div class='dt-memory' style='color:#4b5563'>{render.esc(line)}</div>"
    return text


# ---------------------------------------------------------------- updates


def changed_views(ctx: AppContext, view: RunView, f: Following | None) -> dict[Any, Any]:
    """Updates of the polled views that changed since they were last sent to `f`."""
    if f is None or not f.busy.acquire(blocking=False):  # a slow tick is still at it
        return {}
    try:
        if f.deleted:
            return {}
        fol = f.follower.poll()
        f.memory.poll()
        out: dict[Any, Any] = {}
        status_new = f.changed("status", fol.status_version)
        if f.changed("memory", f.memory.version) or status_new:
            out[view.progress] = progress_html(ctx, f)
        if f.changed("log", fol.log_version):
            out[view.log] = ctx.redact(fol.log_text())
        # A lone point (the step-0 eval) draws no line: the plot waits for a second one.
        if drawable(f.follower.plot_rows()) and f.changed("plot", fol.plot_version):
            out[view.plot] = plot_frame(f)
        version, images = ctx.watchers.get(f.run_dir).snapshot()
        if f.changed("gallery", version):
            out[view.gallery] = gallery_of(ctx, f, images)
            if view.grid is not None:
                out[view.grid] = grid_html(ctx, f, images)
        return out
    finally:
        f.busy.release()


def tick(ctx: AppContext, view: RunView, f: Following | None, message: Any = None) -> Any:
    """The timer's updates; a failure shows in the progress panel (a toast every second
    would bury the page) and is retried at the next tick. `message` (the one under
    Launch) says what became of a run this session queued once it left the queue."""
    try:
        if was_deleted(f):
            return gone(ctx, view, f.run_dir)
        started = launched_elsewhere(ctx, f)
        if started is not None:  # another tab's Launch, or the CLI's
            note = f"now following {ctx.relative(started)}, which started"
            return opened(ctx, view, started, note=note)
        out = changed_views(ctx, view, f)
        if f is not None:
            out.update(moved(ctx, view, f))
        text = queue_message(ctx, out.get(view.following, f))
        if message is not None and text is not None:
            out[message] = render.message_html(text, "info")
        if was_deleted(f):  # while this tick read it: its views would hide the news
            return gone(ctx, view, f.run_dir)
        return out or gr.skip()
    except Exception as exc:
        if was_deleted(f):  # a folder going away under the reader is no failure
            return gone(ctx, view, f.run_dir)
        log.exception("following %s failed", f.run_dir if f else None)
        if f is not None:
            f.sent.pop("status", None)  # redraw the progress once it reads again
        text = f"cannot read the run: {type(exc).__name__}: {exc}"
        return {view.progress: render.message_html(ctx.redact(text), "error")}


def opened(ctx: AppContext, view: RunView, run_dir: str | Path,
           log_offset: int | None = None, note: str = "") -> dict[Any, Any]:
    """Follow `run_dir` in this session: every view sent once, and the new `Following`."""
    f = follow(ctx, run_dir, log_offset=log_offset)  # nothing sent yet: every view changed
    f.note = note
    return {view.following: f, **changed_views(ctx, view, f),
            view.command: actions.reproduce_lines(ctx, f.run_dir),
            view.tensorboard: render.tensorboard_markdown(f.run_dir)}


def cleared(view: RunView, text: str) -> dict[Any, Any]:
    """Follow nothing: every view emptied, `text` in the progress panel."""
    return {view.following: None, view.progress: render.message_html(text, "info"),
            view.log: "", view.plot: None, view.gallery: [], view.command: "",
            view.tensorboard: "", **({view.grid: ""} if view.grid is not None else {})}


def was_deleted(f: Following | None) -> bool:
    """Whether the followed run's folder went (this session's Delete, another's, or
    by hand)."""
    return f is not None and (f.deleted or not f.run_dir.is_dir())


def gone(ctx: AppContext, view: RunView, run_dir: Path) -> dict[Any, Any]:
    """The followed run's folder was deleted: its last state ("done") is no claim to
    keep showing."""
    return cleared(view, f"{ctx.relative(run_dir)} was deleted; open a run on the Runs "
                         "tab to follow it")


def next_run(ctx: AppContext, f: Following) -> Path | None:
    """The run that started after the followed one ended, when this session saw the
    followed one live (opening an old finished run never jumps away from it)."""
    progress = f.follower.progress
    if progress.state in LIVE_STATES:
        f.live_seen, f.ended_at = True, None
    if not f.live_seen or not progress.final:
        return None
    now = time.monotonic()
    f.ended_at = f.ended_at or now
    if now - f.ended_at > HANDOFF_S:
        if not ops.queued_runs(ctx.workspace):  # nothing more will start: stop looking
            f.live_seen = False
            return None
    live = newest_live(ctx)
    return live if live is not None and live.resolve() != f.run_dir.resolve() else None


def launched_elsewhere(ctx: AppContext, f: Following | None) -> Path | None:
    """A run that started while this session follows none, or a run that is not live
    and was not seen live here (whose end `next_run` hands on): started in another tab
    or by the CLI after this view was opened. None otherwise."""
    if f is not None and (f.live_seen or f.follower.progress.state in LIVE_STATES):
        return None
    live = ctx.newest_live(max_age_s=LIVE_PROBE_S)
    if live is None or (f is not None and live.resolve() in
                        {f.run_dir.resolve(), *f.live_then}):
        return None
    return live


def moved(ctx: AppContext, view: RunView, f: Following) -> dict[Any, Any]:
    """Updates when the followed run has handed over to the next one the queue started."""
    nxt = next_run(ctx, f)
    if nxt is None:
        return {}
    note = (f"{ctx.relative(f.run_dir)} ended ({f.follower.progress.state}); now following "
            f"{ctx.relative(nxt)}, the next run of the queue")
    out = opened(ctx, view, nxt, note=note)
    out[view.following].awaiting = f.awaiting  # the run this session queued, if any
    return out


def queue_message(ctx: AppContext, f: Following | None) -> str | None:
    """What became of the run this session queued, once it left the queue (None until
    then): the message under Launch said "queued" and must not say it any longer."""
    if f is None or f.awaiting is None:
        return None
    awaited, status = f.awaiting, read_status(f.awaiting)
    state = (status.state if status else None) if awaited.is_dir() else "deleted"
    if state == "queued":
        return None
    f.awaiting = None
    if awaited.resolve() == f.run_dir.resolve():  # its progress shows how it goes on
        return f"{ctx.relative(awaited)} left the queue; the view below follows it"
    return f"{ctx.relative(awaited)} is no longer queued ({state or 'unknown'})"

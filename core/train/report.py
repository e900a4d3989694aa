"""What the trainer tells the outside: status.json, events.jsonl and readable log lines.

Only the main process writes; the others keep quiet so the log reads like one run.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.runs.folder import RunFolder
from core.runs.memory import GIB
from core.runs.progress import format_step_line
from core.runs.status import append_event, write_status

if TYPE_CHECKING:
    from core.train.startup_clock import StartupClock
    from core.train.trackers import Tracking

STATUS_EVERY_S = 1.0
ROUNDS_KEPT = 5  # a round's expected duration: the mean of its last few


def rounds_left(step: int, max_steps: int, every: int) -> int:
    """How many rounds of work done every `every` steps and once at the end (eval,
    validation, checkpoints: core/train/loop.py's `periodic` and `finish`) are still to
    come once step `step` finished: the one at `step` itself counts, as it runs after the
    step is reported."""
    if every <= 0 or step > max_steps:
        return 0
    return max_steps // every - (step - 1) // every + (1 if max_steps % every else 0)


def eta_seconds(step: int, max_steps: int, per_step: float | None,
                rounds: dict[str, tuple[int, list[float]]]) -> float | None:
    """Seconds left: the steps at `per_step`, plus each kind of round still to come at
    the mean duration measured in this run (`rounds`: kind -> (every, durations)). A kind
    not measured yet adds nothing; None until a step time is known."""
    if per_step is None:
        return None
    extra = sum(rounds_left(step, max_steps, every) * sum(durations) / len(durations)
                for every, durations in rounds.values() if durations)
    return round(per_step * (max_steps - step) + extra, 1)


def earlier_measurements(events: Path) -> tuple[float | None, dict[str, list[float]]]:
    """What earlier launches of a run measured, from its events.jsonl: the seconds a
    step took (the last reported rate) and the durations of each kind of round (the
    last few). A resumed or extended launch starts with these, so its first ETAs count
    the eval and validation rounds still to come instead of the steps alone."""
    try:
        lines = events.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None, {}
    per_step: float | None = None
    rounds: dict[str, list[float]] = {}
    for line in lines:
        if '"step"' not in line and '"seconds"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        rate, seconds = event.get("it_s"), event.get("seconds")
        if event.get("type") == "step" and isinstance(rate, (int, float)) and rate > 0:
            per_step = 1.0 / rate
        elif isinstance(seconds, (int, float)) and seconds >= 0:
            rounds.setdefault(str(event.get("type")), []).append(float(seconds))
    return per_step, {kind: times[-ROUNDS_KEPT:] for kind, times in rounds.items()}


class Reporter:
    def __init__(self, run_dir: Path, is_main: bool, max_steps: int,
                 every: dict[str, int] | None = None) -> None:
        """`every`: the periodic work besides steps, by kind ("eval": 50, ...), whose
        measured durations (`took`) the ETA counts in."""
        self.run_dir = run_dir
        self.is_main = is_main
        self.max_steps = max_steps
        self._step_times: deque[float] = deque(maxlen=20)
        self._last_status = 0.0
        self._last_step_at: float | None = None
        self.tracking: Tracking | None = None  # TensorBoard / W&B, once they started
        self._not_steps = 0.0  # seconds since the last step spent on rounds
        self._rounds = {kind: (n, deque(maxlen=ROUNDS_KEPT))
                        for kind, n in (every or {}).items()}
        self._earlier_step: float | None = None  # an earlier launch's step time
        self.startup: StartupClock | None = None  # until the first step is reported
        self.last_step: int | None = None  # the newest step reported (status.json's end)
        # train.token_routing: (routed, seen) image tokens of each step not yet reported.
        self._routed: dict[int, tuple[int, int]] = {}

    def phase_done(self, phase: str) -> None:
        """A start-up phase (core/train/startup_clock.py) ended now."""
        if self.startup is not None:
            self.startup.mark(phase)

    def started(self) -> None:
        """The first step is done: where the start-up time went, as a `startup` event
        and a log line; the clock stops."""
        if self.startup is None:
            return
        self.startup.mark("first_step")
        self.event("startup", **self.startup.summary())
        self.say(self.startup.line())
        self.startup = None

    def continue_from(self) -> None:
        """A resumed (or extended) run: the ETA starts from what the earlier launches
        measured (`earlier_measurements`) until this launch has measured its own."""
        per_step, rounds = earlier_measurements(RunFolder(self.run_dir).events)
        self._earlier_step = per_step
        for kind, times in rounds.items():
            if kind in self._rounds and not self._rounds[kind][1]:
                self._rounds[kind][1].extend(times)

    def took(self, kind: str, seconds: float) -> None:
        """A round of periodic work (`kind` of `every`) took `seconds`."""
        if kind in self._rounds:
            self._rounds[kind][1].append(seconds)
        self._not_steps += seconds  # nor is it part of the next step's time

    def eta(self, step: int) -> float | None:
        rounds = {kind: (n, list(times)) for kind, (n, times) in self._rounds.items()}
        per_step = self.seconds_per_step() or self._earlier_step
        return eta_seconds(step, self.max_steps, per_step, rounds)

    def say(self, line: str) -> None:
        if self.is_main:
            print(line, flush=True)

    def status(self, state: str, **fields: Any) -> None:
        """status.json and a status event; the newest step goes with it, so a run that
        ends between the (once a second) step updates shows its last step, not an older
        one, in the Runs table."""
        if self.last_step is not None and "step" not in fields:
            fields["step"] = self.last_step
        if self.is_main:
            write_status(self.run_dir, state=state, pid=os.getpid(),
                         max_steps=self.max_steps, **fields)
            append_event(self.run_dir, {"type": "status", "state": state, **fields})

    def event(self, kind: str, **fields: Any) -> None:
        if self.is_main:
            append_event(self.run_dir, {"type": kind, **fields})

    def eval(self, step: int, result: dict[str, Any], seconds: float) -> None:
        """An `eval` event (core/train/evaluation.py's figures, the time it took), a log
        line, the trackers."""
        self.event("eval", step=step, seconds=seconds, **result)
        self.say(f"eval step {step}: loss {result['loss']:.4f} "
                 f"loss_shuffled {result['loss_shuffled']:.4f}")
        if self.tracking is not None:
            self.tracking.eval(step, result)

    def validation(self, step: int, paths: list[Path], prompts: list[str],
                   seconds: float) -> None:
        """A `validation` event (with the time it took), a log line, the images to the
        trackers."""
        self.event("validation", step=step, images=[str(p) for p in paths], seconds=seconds)
        if paths:
            self.say(f"validation images for step {step}: {paths[0].parent}")
        if self.tracking is not None:
            self.tracking.images(step, paths, prompts)

    def lora_saved(self, step: int, files: dict[str, Path]) -> None:
        """A `lora_saved` event (an intermediate LoRA, lora/step_NNNNNN/) and a log line."""
        paths = [str(p) for p in files.values()]
        folder = str(next(iter(files.values())).parent) if files else ""
        self.event("lora_saved", step=step, folder=folder, paths=paths)
        self.say(f"LoRA of step {step} saved: {folder}")

    def memory(self, snapshot: dict[str, Any]) -> None:
        """A `memory` event (core/train/memory.py) and a line in the log."""
        self.event("memory", **snapshot)
        parts = []
        if snapshot.get("device_bytes") is not None:
            parts.append(f"GPU {snapshot['device_bytes'] / GIB:.2f} GiB")
            # Phase "peak" gives the run's peak first; its interval's peak, smaller, would
            # read as a contradiction ("GPU 23.25 GiB (peak 22.48 GiB)", seen on an H200).
            if snapshot.get("device_peak_bytes") is not None and snapshot["phase"] != "peak":
                parts[-1] += f" (peak {snapshot['device_peak_bytes'] / GIB:.2f} GiB)"
        if snapshot.get("host_rss_bytes") is not None:
            parts.append(f"host {snapshot['host_rss_bytes'] / GIB:.2f} GiB")
        if parts:
            self.say(f"memory, {snapshot['phase']}: " + ", ".join(parts))

    def seconds_per_step(self) -> float | None:
        if not self._step_times:
            return None
        ordered = sorted(self._step_times)
        return ordered[len(ordered) // 2]

    def step(self, step: int, loss: float, lr: float, epoch: int) -> None:
        """One optimizer step finished: an event, a log line, status at most once a second."""
        self.steps([(step, loss, lr, epoch)])

    def routed(self, step: int, counts: tuple[int, int]) -> None:
        """Step `step` routed counts[0] of the counts[1] image tokens that reached the
        routed blocks around them (this process's, all micro-batches): reported with
        the step's loss (by the main process, which alone reports steps)."""
        if self.is_main:
            self._routed[step] = counts

    def steps(self, rows: list[tuple[int, float, float, int]]) -> None:
        """Steps (step, loss, lr, epoch) whose losses were read together (train.log_every):
        the time since the last report, less the rounds between, is shared evenly among
        them, as the device ran them back to back; an event and a line each, status at
        most once a second, for the newest."""
        now = time.monotonic()
        if self._last_step_at is not None:
            each = max(0.0, now - self._last_step_at - self._not_steps) / len(rows)
            self._step_times.extend([each] * len(rows))
        self._last_step_at, self._not_steps = now, 0.0
        self.last_step = rows[-1][0]
        if not self.is_main:
            return
        per_step = self.seconds_per_step()
        rate = None if not per_step else round(1.0 / per_step, 3)
        for step, loss, lr, epoch in rows:
            eta = self.eta(step)
            routed = self._routed.pop(step, None)
            extra = {} if routed is None else {"routed_tokens": routed[0], "tokens": routed[1]}
            append_event(self.run_dir, {"type": "step", "step": step, "loss": loss, "lr": lr,
                                        "epoch": epoch, "it_s": rate, "eta_s": eta, **extra})
            if self.tracking is not None:
                self.tracking.scalars(step, {"train/loss": loss, "train/lr": lr})
            # The line's format lives beside its parser (the CLI's progress line reads it).
            print(format_step_line(step, self.max_steps, loss, lr, rate, eta, routed),
                  flush=True)
        if now - self._last_status >= STATUS_EVERY_S or step == self.max_steps:
            write_status(self.run_dir, state="running", pid=os.getpid(), step=step,
                         max_steps=self.max_steps, eta_s=eta, loss=loss, it_s=rate)
            self._last_status = now

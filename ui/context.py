"""The app object: what one running UI server owns, shared by its browser sessions.

- the workspace (every path the UI serves or writes lives under it),
- handles on the runs it started or reattached to, polled by a monitor thread so a run
  that ends is finalized (done/failed/stopped from its exit code) even when no browser
  is watching, and its launcher is reaped,
- the current cache build job and auto-captioning job,
- the pool of validation-image watchers,
- the run queue's starter: the monitor starts the workspace's next queued run once no
  run is live (`core.ops.start_next_queued`; the queue itself is a file in the
  workspace, so a restarted app picks it up where it was).

At start it reads the run registry: live runs are reattached, and dead runs whose status
still said "running" are recorded as failed (`core.ops.reconcile_runs`, the one explicit
step that writes; listing runs elsewhere only reads).
Nothing here is module-global: tests start several apps in one process.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from core import ops
from core.ops import CacheJob, CaptionJob, RunFolder, RunHandle, RunInfo, attach
from ui.watch import WatcherPool

log = logging.getLogger(__name__)

MONITOR_S = 1.0
# Tokens that must never reach a component, should a child print one.
SECRET_PATTERNS = (
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),
    re.compile(r"(?i)\b(token|password|passwd|secret|api[_-]?key)(\s*[=:]\s*)\S+"),
)


class AppContext:
    def __init__(self, workspace: str | Path, secrets: list[str] | None = None,
                 monitor: bool = True):
        self.workspace = Path(workspace).expanduser().absolute()
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.secrets = [s for s in (secrets or []) if s]
        self.watchers = WatcherPool()
        self.cache_job: CacheJob | None = None
        self.caption_job: CaptionJob | None = None
        self._handles: dict[Path, RunHandle] = {}
        self._busy: set[Path] = set()  # runs being stopped: the monitor leaves them alone
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._live_probe: tuple[float, Path | None] = (float("-inf"), None)
        self.startup_runs = self.reattach()
        self._thread: threading.Thread | None = None
        if monitor:
            self._thread = threading.Thread(target=self._monitor, name="run-monitor",
                                            daemon=True)
            self._thread.start()

    # ------------------------------------------------------------ runs

    def reattach(self) -> list[RunInfo]:
        """Follow every live run of the registry; records dead ones as failed."""
        infos = ops.reconcile_runs(self.workspace)
        for info in infos:
            if info.alive:
                handle = attach(RunFolder(info.run_dir))
                if handle is not None:
                    self.track(handle)
        return infos

    def track(self, handle: RunHandle) -> None:
        with self._lock:
            self._handles[Path(handle.run_dir).resolve()] = handle

    def handle(self, run_dir: str | Path) -> RunHandle | None:
        """Our handle on a run, reattaching to one another process started."""
        key = Path(run_dir).resolve()
        with self._lock:
            handle = self._handles.get(key)
        if handle is None and (handle := attach(RunFolder(key))) is not None:
            self.track(handle)
        return handle

    def forget(self, run_dir: str | Path) -> None:
        with self._lock:
            self._handles.pop(Path(run_dir).resolve(), None)

    def live_handles(self) -> list[RunHandle]:
        with self._lock:
            return [h for k, h in self._handles.items() if k not in self._busy]

    def newest_live(self, max_age_s: float = 0.0) -> Path | None:
        """The newest live run of the workspace's registry (any launcher's: this app's
        sessions, the CLI); with `max_age_s`, a look that recent is reused, so sessions
        polling for a run started elsewhere read the registry once for all."""
        now = time.monotonic()
        with self._lock:
            at, found = self._live_probe
            if now - at < max_age_s:
                return found
        live = [i for i in ops.list_runs(self.workspace) if i.alive]
        found = live[0].run_dir if live else None
        with self._lock:
            self._live_probe = (now, found)
        return found

    def anything_live(self) -> bool:
        """Whether a run (being stopped included), a cache build or a captioning job
        runs: the page polls every second then, and seldom otherwise."""
        with self._lock:
            if self._handles:
                return True
        return any(job is not None and job.poll() is None
                   for job in (self.cache_job, self.caption_job))

    @contextlib.contextmanager
    def exclusive(self, run_dir: str | Path) -> Iterator[None]:
        """Keep the monitor off a run while a stop finalizes it (RunHandle is not
        thread-safe; two finalizers would write the final state twice)."""
        key = Path(run_dir).resolve()
        with self._lock:
            self._busy.add(key)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(key)

    def _monitor(self) -> None:
        while not self._closed.wait(MONITOR_S):
            for handle in self.live_handles():
                try:
                    if handle.poll() is not None:
                        self.forget(handle.run_dir)
                except Exception:  # one broken run folder must not stop the monitor
                    log.exception("polling run %s failed", handle.run_dir)
            self.start_queued()
            for job in (self.cache_job, self.caption_job):
                if job is not None:
                    try:
                        job.poll()
                    except Exception:
                        log.exception("polling job %s failed", job.folder.root)

    def start_queued(self) -> ops.Launched | None:
        """Start the next queued run if nothing is live, and follow it."""
        try:
            launched = ops.start_next_queued(self.workspace)
        except Exception:  # a broken queue file or folder must not stop the monitor
            log.exception("starting the next queued run failed")
            return None
        if launched is not None and launched.handle is not None:
            self.track(launched.handle)
        return launched

    # ------------------------------------------------------------ misc

    def redact(self, text: str) -> str:
        """Mask secrets (login passwords, tokens) in text bound for the browser."""
        for secret in self.secrets:
            text = text.replace(secret, "****")
        text = SECRET_PATTERNS[0].sub("hf_****", text)
        return SECRET_PATTERNS[1].sub(lambda m: f"{m.group(1)}{m.group(2)}****", text)

    def relative(self, path: str | Path) -> str:
        """A path as shown to the user: relative to the workspace when inside it."""
        p = Path(path)
        try:
            return str(p.resolve().relative_to(self.workspace.resolve()))
        except ValueError:
            return str(p)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=3)
        self.watchers.close()

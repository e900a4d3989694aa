"""Validation images of a run as they appear: a watchdog observer per run folder.

The trainer writes `validation/step_NNNNNN/NN.png` through a temp name and a rename, so
a finished image shows up as a create or move event for a `.png`; temp files are
ignored. Events land in a lock-protected set that the UI's timer reads (`snapshot`), so
a new image is visible at the next tick instead of after a directory scan. A rescan now
and then covers what inotify can miss (a folder created and filled before its watch was
added) and an observer that failed to start (inotify limits): then scans alone serve.

A video family also writes `NN.mp4` (validation.frames > 1), before its `NN.png`: an
image records the video beside it, looked for when the image arrives and updated when
an `.mp4` comes or goes, so the gallery can show the video in the image's place.

The pool belongs to the app object (one watcher per run folder, shared by sessions).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

from core.ops import RunFolder

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step_(\d+)$")
IMAGE = re.compile(r"^(\d+)\.png$")
VIDEO = re.compile(r"^(\d+)\.mp4$")
RESCAN_S = 5.0
MAX_WATCHERS = 8


@dataclass(frozen=True, order=True)
class ValidationImage:
    step: int
    index: int
    path: Path
    video: Path | None = field(default=None, compare=False)  # the NN.mp4 beside it


def parse_image(path: Path, validation: Path) -> ValidationImage | None:
    """The image's step and prompt index when `path` is validation/step_N/NN.png."""
    if path.parent.parent != validation:
        return None
    step, image = STEP_DIR.match(path.parent.name), IMAGE.match(path.name)
    if not step or not image:
        return None
    return ValidationImage(int(step.group(1)), int(image.group(1)), path)


class GalleryWatcher:
    """The validation images of one run; `version` grows whenever the set changes."""

    def __init__(self, run_dir: Path, rescan_s: float = RESCAN_S):
        self.run_dir = Path(run_dir)
        self.validation = RunFolder(self.run_dir).validation
        self.rescan_s = rescan_s
        self.version = 0
        self._images: dict[Path, ValidationImage] = {}
        self._lock = threading.Lock()
        self._observer = None
        self._last_scan = 0.0

    def start(self) -> GalleryWatcher:
        self.scan()
        if not self.run_dir.is_dir():  # deleted: watching would have to make it again
            return self  # scans still answer (nothing) should it come back
        try:
            self._observer = _start_observer(self)
        except Exception as exc:  # inotify limits, odd file systems: scans still work
            log.warning("watching %s failed (%s); falling back to periodic scans",
                        self.run_dir, exc)
        return self

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
            self._observer = None

    def add(self, path: Path) -> None:
        path = Path(path)
        if VIDEO.match(path.name):
            self._video_changed(path)
            return
        item = parse_image(path, self.validation)
        if item is None or item.path in self._images or not item.path.is_file():
            return
        video = item.path.with_suffix(".mp4")
        item = replace(item, video=video if video.is_file() else None)
        with self._lock:
            if item.path not in self._images:
                self._images[item.path] = item
                self.version += 1

    def remove(self, path: Path) -> None:
        path = Path(path)
        if VIDEO.match(path.name):
            self._video_changed(path)
            return
        with self._lock:
            if self._images.pop(path, None) is not None:
                self.version += 1

    def _video_changed(self, video: Path) -> None:
        """An NN.mp4 came or went: the image beside it (if known) records it or not."""
        image = video.with_suffix(".png")
        now = video if video.is_file() else None
        with self._lock:
            item = self._images.get(image)
            if item is not None and item.video != now:
                self._images[image] = replace(item, video=now)
                self.version += 1

    def scan(self) -> None:
        """List the folder (cheap: one directory per validation step)."""
        self._last_scan = time.monotonic()
        listed = set(self.validation.glob("step_*/*")) if self.validation.is_dir() else set()
        found = {p for p in listed if p.suffix == ".png"}
        with self._lock:
            gone = [p for p in self._images if p not in found]
            for p in gone:
                del self._images[p]
            self.version += bool(gone)
            # a video that came or went unseen (the observer missed it, or there is none)
            stale = [i.path.with_suffix(".mp4") for i in self._images.values()
                     if (i.path.with_suffix(".mp4") in listed) != (i.video is not None)]
        for path in found:
            self.add(path)
        for video in stale:
            self._video_changed(video)

    def snapshot(self) -> tuple[int, list[ValidationImage]]:
        """(version, images newest step first, prompts in order within a step)."""
        due = self._observer is None or time.monotonic() - self._last_scan > self.rescan_s
        if due:
            self.scan()
        with self._lock:
            items = sorted(self._images.values(), key=lambda i: (-i.step, i.index))
            return self.version, items


def _start_observer(watcher: GalleryWatcher):
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers import Observer

    class Handler(FileSystemEventHandler):
        def on_created(self, event) -> None:
            if event.is_directory:
                try:  # filled before the watch; a temporary folder may be renamed already
                    found = list(Path(event.src_path).glob("*.*"))
                except FileNotFoundError:
                    found = []
                for path in found:
                    watcher.add(path)
            else:
                watcher.add(Path(event.src_path))

        def on_moved(self, event) -> None:
            watcher.remove(Path(event.src_path))
            if not event.is_directory:
                watcher.add(Path(event.dest_path))

        def on_deleted(self, event) -> None:
            watcher.remove(Path(event.src_path))

    observer = Observer()
    observer.daemon = True
    observer.schedule(Handler(), str(watcher.run_dir), recursive=True)
    observer.start()
    return observer


class WatcherPool:
    """One watcher per run folder, the least recently used stopped beyond MAX_WATCHERS."""

    def __init__(self, limit: int = MAX_WATCHERS):
        self.limit = limit
        self._watchers: OrderedDict[Path, GalleryWatcher] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_dir: str | Path) -> GalleryWatcher:
        key = Path(run_dir).resolve()
        with self._lock:
            watcher = self._watchers.get(key)
            if watcher is not None:
                self._watchers.move_to_end(key)
                return watcher
            watcher = self._watchers[key] = GalleryWatcher(key).start()
            while len(self._watchers) > self.limit:
                _, old = self._watchers.popitem(last=False)
                old.stop()
            return watcher

    def drop(self, run_dir: str | Path) -> None:
        """Stop watching a run (its folder was deleted)."""
        with self._lock:
            watcher = self._watchers.pop(Path(run_dir).resolve(), None)
        if watcher is not None:
            watcher.stop()

    def close(self) -> None:
        with self._lock:
            for watcher in self._watchers.values():
                watcher.stop()
            self._watchers.clear()

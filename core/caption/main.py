"""`--stage caption`: the program that writes captions for a config's datasets.

    python -m core.caption.main --config JOB/config.toml --workspace W \
        [--events JOB/events.jsonl]

One process (a captioner is small next to a diffusion model); the run manager starts it
like a cache build, so it has a log, a clean stop and an honest final state. It prints
`captioned 12/40` lines as it goes and, with --events, appends `caption_progress` events
for the UI. A bad image is skipped and named, never fatal.
Exit codes (core.exits): 0 done, 2 invalid config or model, 1 failed, 130 stopped.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.exits import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_STOPPED,
    exit_with,
    stop_signals_interrupt,
)

if TYPE_CHECKING:
    from core.caption.model import Captioner
    from core.caption.plan import DatasetPlan
    from core.config import CaptioningConfig


def say(line: str) -> None:
    print(line, flush=True)


@dataclass
class Tally:
    total: int
    done: int = 0  # processed: captioned or skipped
    written: int = 0
    backups: int = 0
    kept: int = 0
    skipped: list[str] = field(default_factory=list)  # "path: reason"
    events: Path | None = None

    def report(self) -> None:
        skipped = f" ({len(self.skipped)} skipped)" if self.skipped else ""
        say(f"captioned {self.done}/{self.total}{skipped}")
        if self.events:
            with open(self.events, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"type": "caption_progress", "done": self.done,
                                         "total": self.total, "written": self.written,
                                         "skipped": len(self.skipped)}) + "\n")

    def lines(self) -> list[str]:
        out = [f"summary: wrote {self.written} caption(s), kept {self.kept} existing "
               f"caption(s), {self.backups} old caption(s) kept as .bak, skipped "
               f"{len(self.skipped)} image(s)"]
        out += [f"  skipped {entry}" for entry in self.skipped]
        return out


def _load_images(paths: list[Path], tally: Tally) -> list[tuple[Path, object]]:
    """(path, RGB image) of the readable ones; the others are skipped and named."""
    from core.data.images import BadImage, load_rgb

    loaded = []
    for path in paths:
        try:
            loaded.append((path, load_rgb(path)))
        except (BadImage, OSError) as exc:
            reason = exc.reason if isinstance(exc, BadImage) else str(exc)
            tally.skipped.append(f"{path}: {reason}")
            say(f"warning: {path}: {reason}; skipped")
    return loaded


def caption_batch(captioner: Captioner, paths: list[Path], opts: CaptioningConfig,
                  tally: Tally) -> None:
    from core.caption.model import generate_captions
    from core.caption.plan import join_caption, write_caption

    loaded = _load_images(paths, tally)
    texts = generate_captions(captioner, [im for _, im in loaded],
                              opts.max_new_tokens) if loaded else []
    for (path, _), text in zip(loaded, texts, strict=True):
        caption = join_caption(opts.prefix, text, opts.suffix)
        if not caption:
            tally.skipped.append(f"{path}: the model gave an empty caption")
            continue
        written, backup = write_caption(path, caption, opts.overwrite)
        if written is None:  # the user wrote one meanwhile: theirs stays
            tally.kept += 1
            continue
        tally.written += 1
        tally.backups += backup is not None
    tally.done += len(paths)
    tally.report()


def run(captioner: Captioner, plans: list[DatasetPlan], opts: CaptioningConfig,
        events: Path | None) -> Tally:
    tally = Tally(total=sum(len(p.todo) for p in plans), events=events)
    tally.kept = sum(p.kept for p in plans)
    for plan in plans:
        say(f"dataset '{plan.id}': {len(plan.todo)} image(s) to caption, {plan.kept} "
            "already captioned (kept)")
        for image in plan.shared:
            say(f"warning: {image}: shares its .txt with another image of the same name; "
                "captioned once")
        for start in range(0, len(plan.todo), opts.batch_size):
            caption_batch(captioner, plan.todo[start:start + opts.batch_size], opts, tally)
    return tally


def _setup(config: Path, workspace: Path):
    """(resolved config, plans) or None after printing the problems."""
    from core.caption.plan import caption_problems, plan_dataset, target_datasets
    from core.config import load_config, resolved
    from core.problems import ConfigError, errors

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        for problem in exc.problems:
            say(str(problem))
        return None
    found = errors(caption_problems(cfg, workspace))
    for problem in found:
        say(str(problem))
    if found:
        return None
    full = resolved(cfg, workspace)
    plans, folders = [], set()
    for _, ds in target_datasets(full):
        folder = Path(ds.images).resolve()
        if folder in folders:  # two datasets over one folder: caption it once
            say(f"dataset '{ds.id}': its images folder was captioned above; skipped")
            continue
        folders.add(folder)
        plans.append(plan_dataset(ds, full.captioning.overwrite))
    return full, plans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--events", help="append progress events (JSON lines) here")
    args = parser.parse_args(argv)
    from core.notices import quiet_library_notices

    stop_signals_interrupt()  # the Stop button's SIGINT, even from a backgrounded app
    quiet_library_notices()  # caption.log shows what the user needs
    workspace = Path(args.workspace).expanduser().absolute()
    try:
        return _main(Path(args.config), workspace, Path(args.events) if args.events else None)
    except KeyboardInterrupt:
        say("stopped; the captions written so far are kept")
        return EXIT_STOPPED


def _main(config: Path, workspace: Path, events: Path | None) -> int:
    from core.caption.model import CaptionerLoadError, load_captioner
    from core.caption.plan import CaptionWriteError, resolve_captioner

    setup = _setup(config, workspace)
    if setup is None:
        return EXIT_INVALID
    cfg, plans = setup
    opts = cfg.captioning
    if not any(p.todo for p in plans):
        say(f"nothing to caption: every image has a caption ({sum(p.kept for p in plans)} "
            "kept); set captioning.overwrite = true to caption them again")
        return EXIT_OK
    source = resolve_captioner(opts.model, workspace)
    try:
        captioner = load_captioner(source, cpu=cfg.launch.cpu)
    except CaptionerLoadError as exc:
        say(f"error: {exc}")
        return EXIT_INVALID
    say(f"captioner: {captioner.describe()}")
    try:
        tally = run(captioner, plans, opts, events)
    except CaptionWriteError as exc:
        say(f"error: {exc}")
        return EXIT_FAILED
    except OSError as exc:  # e.g. a read-only dataset folder
        say(f"error: cannot write a caption: {exc}; check that the images folder is "
            "writable")
        return EXIT_FAILED
    for line in tally.lines():
        say(line)
    return EXIT_OK


if __name__ == "__main__":
    from core.libraries import preload_for_encoding

    preload_for_encoding()
    exit_with(main())

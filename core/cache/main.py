"""`--stage cache`: the program `accelerate launch` runs to build the caches.

    accelerate launch [--multi_gpu --num_processes N] -m core.cache.main \
        --config JOB/config.toml --workspace W [--events JOB/events.jsonl]

Prints a tqdm bar on the main process and, with --events, appends progress events as JSON
lines for the UI. Exit codes (core.exits): 0 done, 2 invalid input, 1 failed, 130
stopped (SIGINT or SIGTERM: the entries written so far are kept, each whole; a build
again does the rest).
"""

from __future__ import annotations

import argparse
import json
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
from core.problems import errors_first

if TYPE_CHECKING:
    from core.config import Config
    from core.models.base import Components, ModelFamily
    from core.startup import ProcessGroup


def _progress_sink(events: Path | None, show_bar: bool, process: int):
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def report(kind: str, done: int, total: int) -> None:
        if show_bar:
            if kind not in bars:
                # One bar at a time: tqdm draws a second open bar one row down with
                # cursor-up codes, which a log (and a terminal that follows it) shows raw.
                for other in bars.values():
                    other.close()
                bars.clear()
                bars[kind] = tqdm(total=total, desc=f"{kind} cache", unit="entry",
                                  dynamic_ncols=True)
            bars[kind].update(done - bars[kind].n)
        if events:
            with open(events, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"type": "cache_progress", "kind": kind,
                                         "process": process, "done": done,
                                         "total": total}) + "\n")

    return report, bars


class CachingOutOfMemory(Exception):
    """The GPU ran out of memory while the encoders arrived or while encoding; the message
    says what to do."""


def load_for_caching(config: Path, workspace: Path
                     ) -> tuple[Config, ModelFamily, Components, ProcessGroup] | None:
    from accelerate import PartialState

    from core.memory.advice import out_of_memory_becomes
    from core.models.loading import resolve_dtype
    from core.models.modules import avoid_cudnn_attention, cap_gpu_memory, move_encoders
    from core.startup import load_model, load_resolved_config, process_group

    avoid_cudnn_attention()
    cap_gpu_memory()
    cfg = load_resolved_config(config, workspace)
    if cfg is None:
        return None
    state = PartialState(cpu=cfg.launch.cpu)
    # In the dtype training uses, on the CPU; only the encoders and the VAE, which build
    # the caches, go to the GPU (the denoiser is not needed here: a random: one is left
    # on the meta device, never filled, so it costs no host memory).
    family, components = load_model(cfg, workspace.absolute(), state, device="cpu",
                                    dtype=resolve_dtype(cfg.train.mixed_precision),
                                    stream_denoiser=True)
    with out_of_memory_becomes(CachingOutOfMemory, cfg, "caches"):
        move_encoders(components, state.device, cfg.model.stream_text_encoders)
    return cfg, family, components, process_group(state)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--events", help="append progress events (JSON lines) here")
    args = parser.parse_args(argv)
    stop_signals_interrupt()  # the Stop button's SIGINT, even from a backgrounded app
    try:
        return _build(args)
    except KeyboardInterrupt:
        print("stopped by the user: the entries written so far are kept; building the "
              "caches again does the rest", flush=True)
        return EXIT_STOPPED


def _build(args: argparse.Namespace) -> int:
    from core.cache.stage import build_caches
    from core.notices import quiet_library_notices

    quiet_library_notices()  # cache.log shows what the user needs
    from core.cache.store import CacheWriteError
    from core.memory.advice import out_of_memory_becomes
    from core.models.loading import ModelLoadError

    try:
        setup = load_for_caching(Path(args.config), Path(args.workspace))
    except ModelLoadError as exc:
        print(exc, flush=True)
        return EXIT_INVALID
    except CachingOutOfMemory as exc:
        print(f"error: {exc}", flush=True)
        return EXIT_FAILED
    if setup is None:
        return EXIT_INVALID
    cfg, family, components, group = setup
    report_progress, bars = _progress_sink(Path(args.events) if args.events else None,
                                           show_bar=group.is_main, process=group.index)
    try:
        with out_of_memory_becomes(CachingOutOfMemory, cfg, "caches"):
            report = build_caches(cfg, family, components, group, progress=report_progress)
    except (CacheWriteError, CachingOutOfMemory) as exc:
        print(f"error: {exc}", flush=True)
        return EXIT_FAILED
    for bar in bars.values():
        bar.close()
    # Plan problems are the same everywhere; build problems belong to one process.
    shown = report.problems if group.is_main else report.vae.problems + report.text.problems
    for problem in errors_first(shown):
        print(problem, flush=True)
    print(f"process {group.index}/{group.count}: wrote {report.vae.written} vae, "
          f"{report.text.written} text entries", flush=True)
    if group.is_main:
        for line in report.lines():
            print(line, flush=True)
    return EXIT_OK


if __name__ == "__main__":
    from core.libraries import preload_for_encoding

    preload_for_encoding()
    exit_with(main())

"""`--stage cache`: the program `accelerate launch` runs to build the caches.

    accelerate launch [--multi_gpu --num_processes N] -m core.cache.main \
        --config run.toml --workspace W [--events cache_events.jsonl]

Prints a tqdm bar on the main process and, with --events, appends progress events as JSON
lines for the UI. Exit codes: 0 done, 2 invalid input, 1 failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from core.problems import errors_first


def _progress_sink(events: Path | None, show_bar: bool, process: int):
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def report(kind: str, done: int, total: int) -> None:
        if show_bar:
            bar = bars.get(kind) or bars.setdefault(
                kind, tqdm(total=total, desc=f"{kind} cache", unit="entry", dynamic_ncols=True))
            bar.update(done - bar.n)
        if events:
            with open(events, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"type": "cache_progress", "kind": kind,
                                         "process": process, "done": done,
                                         "total": total}) + "\n")

    return report, bars


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--events", help="append progress events (JSON lines) here")
    args = parser.parse_args(argv)

    from core.cache.session import load_for_caching
    from core.cache.stage import build_caches
    from core.cache.store import CacheWriteError
    from core.models.common import ModelLoadError

    try:
        setup = load_for_caching(Path(args.config), Path(args.workspace))
    except ModelLoadError as exc:
        print(exc, flush=True)
        return 2
    if setup is None:
        return 2
    cfg, family, components, group = setup
    report_progress, bars = _progress_sink(Path(args.events) if args.events else None,
                                           show_bar=group.is_main, process=group.index)
    try:
        report = build_caches(cfg, family, components, group, progress=report_progress)
    except CacheWriteError as exc:
        print(f"error: {exc}", flush=True)
        return 1
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
    return 0


if __name__ == "__main__":
    sys.exit(main())

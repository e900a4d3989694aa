"""Benchmark: where a training launch's time goes before its first step.

    python bench/startup.py [--launches 3] [--preset demo] [--workspace DIR] [--set KEY=VALUE ...]

Launches the preset (the demo by default) through the run manager, as the CLI and the UI
do (`accelerate launch`), with train.max_steps = 1, `--launches` times after one launch
that builds the caches (not counted), and reads each launch's `startup` event
(core/train/startup_clock.py). Prints the median of each phase, the wall time from starting
the launcher to the first step's event, and the ratio the start-up target is stated in:

    launch-to-first-step / (imports + model + caches)

where imports, model and caches are the trainer's own phases (the work a launch cannot
skip: importing the libraries, loading the model, checking the caches). The rest is
overhead: accelerate's launcher, the interpreter, the accelerator, the setup, and the eval
and validation rounds a preset asks for before training (`train.eval_before_training`,
`validation.before_training`), shown apart so their cost is visible.

It also prints how long a launch takes to end once the trainer has said it is done (its
final `status` event) until accelerate's launcher has exited: the processes' own exit,
which a person waits through before the run shows as ended.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import load_line, workspace  # noqa: E402

NEEDED = ("imports", "model", "caches")
# Rounds a config asks for before the first step (train.eval_before_training,
# validation.before_training); each phase is there only when asked.
ASKED = ("eval", "validation")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--workspace", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--timeout", type=float, default=600.0)
    return parser.parse_args(argv)


def launch_once(preset: str, ws: Path, overrides: list[str], index: int,
                timeout: float) -> dict[str, Any]:
    """One launch as `app.py --no-ui --preset P` makes it (check, then `core.ops.launch`),
    waited for; its `startup` phases and the wall time from the launch to the first step."""
    from core import ops
    from core.presets import is_demo

    cfg = ops.load_run_config(None, preset, [*overrides, "train.max_steps=1",
                                             f"output.dir=runs/startup-{index}"])
    if is_demo(preset):
        ops.prepare_demo(cfg, ws, new_output=True)
    checked = ops.check(cfg, ws)
    started = time.time()
    launched = ops.launch(cfg, ws, checked=checked)
    handle, folder = launched.handle, launched.handle.folder
    try:
        code = handle.popen.wait(timeout=timeout)
        ended = time.time()
    finally:
        if handle.popen.poll() is None:
            ops.stop(launched.run_dir, grace_s=30, handle=handle)
    events = [json.loads(line) for line in folder.events.read_text().splitlines() if line]
    startup = next((e for e in events if e["type"] == "startup"), None)
    first = next((e["time"] for e in events if e["type"] == "step"), None)
    if code != 0 or first is None:
        log = folder.log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"launch failed (exit {code}); {folder.log} ends:\n{log}")
    done = [e["time"] for e in events if e["type"] == "status" and e.get("state") == "done"]
    # A trainer from before the startup event (a baseline checkout): the wall time only.
    return {"phases": startup["phases"] if startup else {}, "wall": first - started,
            "done_to_exit": ended - done[-1] if done else None}


def report(launches: list[dict[str, Any]]) -> None:
    phases: dict[str, list[float]] = {}
    for launch in launches:
        for name, seconds in launch["phases"].items():
            phases.setdefault(name, []).append(seconds)
    print(f"{'phase':<14}{'median s':>10}   (over {len(launches)} launches)")
    for name, values in phases.items():
        print(f"{name:<14}{statistics.median(values):>10.2f}")
    wall = statistics.median(launch["wall"] for launch in launches)
    needed = statistics.median(sum(launch["phases"].get(n, 0.0) for n in NEEDED)
                               for launch in launches)
    print(f"{'launch to first step (wall)':<30}{wall:>7.2f} s")
    ends = [launch["done_to_exit"] for launch in launches if launch["done_to_exit"] is not None]
    if ends:
        print(f"{'done to launcher exit (wall)':<30}{statistics.median(ends):>7.2f} s")
    if not needed:
        return
    asked = statistics.median(sum(launch["phases"].get(n, 0.0) for n in ASKED)
                              for launch in launches)
    print(f"{'imports + model + caches':<30}{needed:>7.2f} s")
    print(f"ratio {wall / needed:.2f}; without the rounds the preset asks for before "
          f"training ({asked:.2f} s): {(wall - asked) / needed:.2f} (target <= 1.3)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(load_line())
    with workspace(args.workspace, "bench-startup-") as ws:
        print(f"workspace {ws}; building the caches (first launch, not counted)")
        launch_once(args.preset, ws, args.set, 0, args.timeout)
        launches = [launch_once(args.preset, ws, args.set, i, args.timeout)
                    for i in range(1, args.launches + 1)]
    report(launches)


if __name__ == "__main__":
    main()

"""How long a log line and a validation image take to show up in the app.

    .venv/bin/python bench/ui_latency.py [--samples 8] [--workspace DIR]

Starts the real app on a throwaway workspace with one live run (a sleeping process
registered like a training run, so the page follows it on load, as after a restart),
then, sample by sample, appends a line to its train.log and writes a PNG into
validation/step_N/ (temp name + rename, as the trainer does) and measures until each is
seen:
- server: by the app's own machinery (the RunFollower the timer polls, the watchdog
  gallery watcher), polled every 5 ms: the delay before the next tick can show it;
- browser: in the page (headless Chromium): the log box holding the line, the gallery
  holding the image. This includes the 1 s timer, so about 0.5 s is expected on average.

The baseline is the timer period measured the same way (TICK_S); target: under 1.5 s.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.runs.folder import RunFolder  # noqa: E402  (stdlib only: cheap to import)

TARGET_S = 1.5
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def start_fake_run(workspace: Path) -> Path:
    """A registered, live run that writes nothing itself: the bench writes its files."""
    from core.runs.command import LaunchSpec
    from core.runs.manager import start_run
    from core.runs.status import write_status

    run_dir = workspace / "runs" / "latency"
    spec = LaunchSpec(argv=[sys.executable, "-c", "import time; time.sleep(3600)"],
                      workspace=workspace)
    start_run(spec, run_dir)
    write_status(run_dir, state="running", step=0, max_steps=1000)
    return run_dir


def write_png(run_dir: Path, step: int) -> None:
    from PIL import Image

    folder = RunFolder(run_dir).validation_step(step)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".00.png.tmp"
    Image.new("RGB", (64, 64), (step % 255, 90, 160)).save(tmp, format="PNG")
    os.replace(tmp, folder / "00.png")


def server_watch(seen: dict, key: str, check, t0: float) -> threading.Thread:
    def loop() -> None:
        while time.monotonic() - t0 < 10:
            if check():
                seen[key] = time.monotonic() - t0
                return
            time.sleep(0.005)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def time_both(page, t0: float, server_check, browser_js: str) -> tuple[float, float | None]:
    """Seconds from `t0` until the server sees the change (`server_check`) and until the
    browser shows it (`browser_js`, only with a page), both measured at once."""
    seen: dict[str, float] = {}
    thread = server_watch(seen, "server", server_check, t0)
    browser = None
    if page is not None:
        page.wait_for_function(browser_js, polling="raf", timeout=15_000)
        browser = time.monotonic() - t0
    thread.join()
    return seen.get("server", float("nan")), browser


def sample_log(page, ctx, run_dir: Path, follower, i: int) -> tuple[float, float | None]:
    token = f"latency-probe-{i}-{random.randrange(10**9)}"
    t0 = time.monotonic()
    with open(RunFolder(run_dir).log, "a", encoding="utf-8") as fh:
        fh.write(f"{token}\n")
    return time_both(page, t0, lambda: token in follower.poll().log_text(),
                     f"(document.querySelector('#train-log textarea') || {{value: ''}})"
                     f".value.includes('{token}')")


def sample_image(page, ctx, run_dir: Path, i: int) -> tuple[float, float | None]:
    step = 100_000 + i
    watcher = ctx.watchers.get(run_dir)
    t0 = time.monotonic()
    write_png(run_dir, step)
    return time_both(page, t0, lambda: any(image.step == step
                                           for image in watcher.snapshot()[1]),
                     f"(document.querySelector('#validation-gallery') || {{innerText: ''}})"
                     f".innerText.includes('step {step}')")


def summary(name: str, values: list[float]) -> str:
    values = [v for v in values if v == v]
    if not values:
        return f"{name}: no figures"
    ok = "OK" if max(values) < TARGET_S else "over target"
    return (f"{name}: median {statistics.median(values):.3f}s  max {max(values):.3f}s  "
            f"(n={len(values)}, target < {TARGET_S}s: {ok})")


def open_page(url: str):
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        print("chromium not found (apt-get install -y chromium): browser figures skipped")
        return None, None
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
    page = browser.new_page()
    page.goto(url)
    page.get_by_role("tab", name="Training").click()
    page.wait_for_function("document.querySelector('#train-progress').innerText"
                           ".includes('latency')", timeout=30_000)
    return pw, page


def run(samples: int, workspace: Path) -> None:
    from core.runs.follow import RunFollower
    from core.runs.manager import stop_run
    from ui.app import TICK_S, launch_app
    from ui.context import AppContext

    run_dir = start_fake_run(workspace)
    ctx = AppContext(workspace)
    demo, url = launch_app(ctx, port=_free_port(), prevent_thread_lock=True, quiet=True)
    pw, page = open_page(url)
    follower = RunFollower(run_dir, log_offset=RunFolder(run_dir).log.stat().st_size)
    logs, images = [], []
    try:
        for i in range(samples):
            time.sleep(random.uniform(0.2, 1.2))  # land anywhere in the timer's period
            logs.append(sample_log(page, ctx, run_dir, follower, i))
            time.sleep(random.uniform(0.2, 1.2))
            images.append(sample_image(page, ctx, run_dir, i))
    finally:
        if pw is not None:
            pw.stop()
        stop_run(run_dir, grace_s=2)
        demo.close()
        ctx.close()
    print(f"UI latency, {samples} samples each (timer period, the baseline: {TICK_S:.1f}s)")
    print(summary("log line -> app state (server)", [s for s, _ in logs]))
    print(summary("image    -> app state (server)", [s for s, _ in images]))
    if page is not None:
        print(summary("log line -> browser", [b for _, b in logs]))
        print(summary("image    -> browser", [b for _, b in images]))
        browser_max = max(max(b for _, b in logs), max(b for _, b in images))
        print(f"ratio of the worst browser delay to the timer period: "
              f"{browser_max / TICK_S:.2f}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--workspace", help="default: a temporary folder, removed after")
    args = parser.parse_args()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    if args.workspace:
        run(args.samples, Path(args.workspace).absolute())
        return
    with tempfile.TemporaryDirectory(prefix="ui-latency-") as tmp:
        run(args.samples, Path(tmp))


if __name__ == "__main__":
    main()

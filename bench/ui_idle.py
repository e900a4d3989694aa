"""What an idle page costs: requests per second and CPU of the server and the browser
while nothing runs (no run, no cache build, no captioning).

    .venv/bin/python bench/ui_idle.py [--seconds 30] [--workspace DIR]

Starts the real app (`python app.py --workspace TMP --port P`, its own process, so its
CPU is its own), opens the page in headless Chromium, waits for the page to settle,
then counts the requests the page sends over `--seconds` (Playwright's request events)
and the CPU time the server process and the browser's process tree used meanwhile.
Target: at most 0.3 requests/s (tests/test_ui_quiet_browser.py asserts it); the
ratio printed is requests/s over that target. The browser's baseline is the same
browser showing an empty tab (about:blank), measured first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ui_latency import CHROMIUM_ARGS, _free_port  # noqa: E402

TARGET_RPS = 0.3
SETTLE_S = 15.0  # the form's own events after it is filled, and the first ticks


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU time (user + system) of each process still there."""
    import psutil  # accelerate's dependency: always there with the app

    times = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            times[pid] = t.user + t.system
        except psutil.Error:
            pass
    return times


def used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two `cpu_seconds`: a process that ended meanwhile (a
    Chromium utility process) is left out, not counted as negative time."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def browser_pids() -> list[int]:
    """This bench's Chromium (the browser Playwright started, its renderers, GPU and
    utility processes: descendants of this process). Only those: another program's
    Chromium on a shared machine (a browser test) once counted here too."""
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)
            if "chrom" in p.name().lower()]


def start_server(workspace: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--workspace",
                             str(workspace), "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # wait for the banner
        if "Running on local URL" in line:
            return proc
    raise RuntimeError("the app exited before serving")


def measure(page, seconds: float, pids: list[int]) -> tuple[float, float, float]:
    """(requests/s, server CPU %, browser CPU %) over `seconds`."""
    count = [0]

    def on_request(request) -> None:
        count[0] += 1

    page.on("request", on_request)
    server0, browser0 = cpu_seconds(pids[:1]), cpu_seconds(pids[1:])
    t0 = time.monotonic()
    page.wait_for_timeout(seconds * 1000)
    elapsed = time.monotonic() - t0
    page.remove_listener("request", on_request)
    server = used(server0, cpu_seconds(pids[:1])) / elapsed * 100
    browser = used(browser0, cpu_seconds(pids[1:])) / elapsed * 100
    return count[0] / elapsed, server, browser


def run(seconds: float, workspace: Path) -> None:
    from playwright.sync_api import sync_playwright

    port = _free_port()
    server = start_server(workspace, port)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                        args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto("about:blank")  # the baseline: the same browser showing nothing
            page.wait_for_timeout(SETTLE_S * 1000)  # past the browser's own start
            _, _, blank_cpu = measure(page, min(seconds, 10), [server.pid, *browser_pids()])
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#check-panel .dt-ok", timeout=180_000)  # form filled
            pids = [server.pid, *browser_pids()]
            page.wait_for_timeout(SETTLE_S * 1000)
            rps, server_cpu, browser_cpu = measure(page, seconds, pids)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    ok = "OK" if rps <= TARGET_RPS else "over target"
    print(f"idle page over {seconds:.0f}s (after {SETTLE_S:.0f}s to settle):")
    print(f"  requests/s: {rps:.2f} (target <= {TARGET_RPS}: {ok}; ratio "
          f"{rps / TARGET_RPS:.2f})")
    print(f"  server CPU: {server_cpu:.1f}% of a core")
    print(f"  browser CPU: {browser_cpu:.1f}% of a core (every chromium process; "
          f"baseline, an empty tab: {blank_cpu:.1f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workspace", help="default: a temporary folder, removed after")
    args = parser.parse_args()
    if args.workspace:
        run(args.seconds, Path(args.workspace).absolute())
        return
    with tempfile.TemporaryDirectory(prefix="ui-idle-") as tmp:
        run(args.seconds, Path(tmp))


if __name__ == "__main__":
    main()

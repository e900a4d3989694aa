"""The run queue with real runs, through the real app: a second /launch while a tiny
demo run is live is queued, then runs and finishes after the first; the server serves
the run's LoRA files from the workspace and nothing outside it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_ui_support import demo_config, running_app

pytestmark = pytest.mark.slow


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def final_time(run_dir: Path) -> float:
    """When the run's final state was written (its status.json's updated_at)."""
    from core.runs.status import read_status

    return read_status(run_dir).updated_at or 0.0


def test_second_launch_is_queued_then_runs_after_the_first_and_its_lora_downloads(
        tmp_path: Path):
    import httpx
    from gradio_client import Client

    from core import ops
    from core.runs.status import read_status

    ws = tmp_path / "ws"
    with running_app(ws) as (ctx, url):
        client = Client(url, verbose=False)
        first = client.predict(demo_config(ws, {"output.dir": "runs/first",
                                                "train.max_steps": "12"}),
                               False, api_name="/launch")
        second = client.predict(demo_config(ws, {"output.dir": "runs/second"}),
                                False, api_name="/launch")
        assert (first["queued"], second["queued"]) == (0, 1)
        a, b = Path(first["run_dir"]), Path(second["run_dir"])
        assert read_status(b).state == "queued" and read_status(a).state != "done"
        runs = {r["run_dir"]: r["state"] for r in client.predict(api_name="/runs")}
        assert runs[str(b)] == "queued"

        wait_for(lambda: read_status(b).state in ("done", "failed"), 540,
                 "the queued run to start after the first and finish")
        assert read_status(a).state == "done", a
        assert read_status(b).state == "done", (b / "train.log").read_text()[-2000:]
        assert read_status(b).started_at >= final_time(a) - 1.0, "it waited for the first"

        files = ops.run_downloads(b, ws)
        names = {p.relative_to(b.resolve()).as_posix() for p in files}
        assert {"config.toml", "lora/pytorch_lora_weights.safetensors",
                "lora/step_000004/pytorch_lora_weights.safetensors"} <= names
        lora = b / "lora/pytorch_lora_weights.safetensors"
        served = httpx.get(f"{url}gradio_api/file={lora.resolve()}", timeout=30)
        assert served.status_code == 200 and served.content == lora.read_bytes()
        refused = httpx.get(f"{url}gradio_api/file=/etc/passwd", timeout=30)
        assert refused.status_code != 200 and b"root:" not in refused.content

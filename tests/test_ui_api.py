"""The real app driven with gradio_client: check, cache, launch, status, stop, resume,
and a restarted app reattaching to a live run and marking a dead one failed.

Training and caching are real `accelerate launch` subprocesses on the tiny SD1.5 model.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from test_ui_support import demo_config, running_app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory):
    from gradio_client import Client

    workspace = tmp_path_factory.mktemp("ui-api")
    with running_app(workspace) as (ctx, url):
        yield ctx, Client(url, verbose=False), workspace


def wait_until(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_check_names_a_conflicting_cache_folder_and_passes_a_good_config(app):
    _, client, workspace = app
    bad = demo_config(workspace, {"datasets.0.vae_cache": "demo/shapes/latents"})
    result = client.predict(bad, api_name="/check")
    assert result["ok"] is False
    errors = [p for p in result["problems"] if p["level"] == "error"]
    assert [p["where"] for p in errors] == ["datasets.0.vae_cache"]
    assert "is inside" in errors[0]["message"]
    assert str(workspace / "demo/shapes") in errors[0]["message"]
    good = client.predict(demo_config(workspace), api_name="/check")
    assert good["ok"] is True
    assert "dataset 'shapes': 72 image(s)" in good["lines"]
    with pytest.raises(Exception, match="train.max_step"):
        client.predict(good_toml(workspace).replace("max_steps", "max_step"),
                       api_name="/check")


def good_toml(workspace: Path) -> str:
    return demo_config(workspace)


def test_cache_build_progress_status_and_clear(app):
    ctx, client, workspace = app
    config = demo_config(workspace)
    before = client.predict(config, api_name="/cache_status")[0]
    assert before["images"] == 72 and before["vae"]["cached"] == 0
    job = client.predict(config, 240.0, api_name="/build_cache")
    assert job["state"] == "done", job["log"]
    assert job["progress"]["vae"] == {"done": 72, "total": 72, "eta_s": 0.0}
    assert job["progress"]["text"]["done"] == job["progress"]["text"]["total"] == 24
    after = client.predict(config, api_name="/cache_status")[0]
    assert after["vae"] == {"cached": 72, "stale": 0, "missing": 0}
    assert after["text"]["cached"] == 24
    cleared = client.predict(config, "shapes", api_name="/clear_cache")
    assert cleared["entries"] == 72 and cleared["files"] >= 72
    assert len(list((workspace / "demo/shapes").glob("*.png"))) == 72, "images untouched"
    again = client.predict(config, api_name="/cache_status")[0]
    assert again["vae"]["missing"] == 72 and again["text"]["cached"] == 24


def test_launch_status_stop_resume(app):
    ctx, client, workspace = app
    config = demo_config(workspace, {"train.max_steps": "400", "output.dir": "runs/api"})
    launched = client.predict(config, False, api_name="/launch")
    run_dir = launched["run_dir"]
    assert run_dir == str(workspace / "runs/api")
    assert "core.runs.accelerate_launch" in launched["command"]
    status = wait_until(lambda: (s := client.predict(run_dir, api_name="/status"))
                        ["step"] and s["step"] >= 2 and s, 240, "two training steps")
    assert status["state"] == "running" and status["alive"]
    assert any(line.startswith("step ") for line in status["log"])
    with pytest.raises(Exception, match="a run is still going in this folder"):
        client.predict(config, False, api_name="/launch")
    stopped = client.predict(run_dir, api_name="/stop")
    assert stopped["state"] == "stopped"
    status = client.predict(run_dir, api_name="/status")
    assert status["state"] == "stopped" and not status["alive"]
    step = status["step"]
    assert (Path(run_dir) / "checkpoints").is_dir(), "the trainer saved before stopping"
    with pytest.raises(Exception, match=r"not overwritten.*Output folder = runs/api-2.*Resume"):
        client.predict(config, False, api_name="/launch")

    client.predict(config, True, api_name="/launch")  # resume
    resumed = wait_until(lambda: (s := client.predict(run_dir, api_name="/status"))
                         ["state"] == "running" and (s["step"] or 0) > step and s,
                         240, "the resumed run to pass its old step")
    assert resumed["step"] > step
    assert client.predict(run_dir, api_name="/stop")["state"] == "stopped"
    runs = client.predict(api_name="/runs")
    assert [r["run_dir"] for r in runs] == [run_dir]
    with pytest.raises(Exception, match="not a run of this workspace"):
        client.predict("/etc", api_name="/stop")


def test_restarted_app_reattaches_a_live_run_and_marks_a_dead_one_failed(app):
    from core.runs.registry import run_info
    from core.runs.status import read_status
    from ui.context import AppContext
    from ui.tab_runs import newest_live

    ctx, client, workspace = app
    config = demo_config(workspace, {"train.max_steps": "400", "output.dir": "runs/live"})
    run_dir = Path(client.predict(config, False, api_name="/launch")["run_dir"])
    wait_until(lambda: run_info(run_dir).state == "running", 240, "the run to start")
    ours = ctx.handle(run_dir)
    ctx.forget(run_dir)  # this app steps aside: only the registry knows the run now
    restarted = AppContext(workspace, monitor=False)  # a second app on the same workspace
    try:
        assert newest_live(restarted) == run_dir
        handle = restarted.handle(run_dir)
        assert handle is not None and handle.popen is None, "reattached, not started"
        for p in handle.processes():  # the machine "crashes" the run: SIGKILL everything
            os.kill(p, signal.SIGKILL)
        wait_until(lambda: not handle.processes(), 30, "the killed processes to go")
    finally:
        restarted.close()
    third = AppContext(workspace, monitor=False)
    try:
        info = next(i for i in third.startup_runs if i.run_dir == run_dir)
        assert info.state == "failed" and not info.alive
        assert "killed or crashed" in info.reason
        assert read_status(run_dir).state == "failed", "a starting app records what it found"
        assert newest_live(third) is None
    finally:
        third.close()
        ours.popen.wait(timeout=10)  # reap the launcher this process started


def test_a_flux2_run_launched_through_the_api_trains_and_saves_its_lora(app):
    """Another family than the demo's through the same API: tiny FLUX.2 (klein) trains a
    few steps end to end, validates and writes both LoRA files. The other families train
    in-process in test_train.py's test_each_family_trains_a_few_steps; the launch path
    does not depend on the family, so one more family here covers it."""
    _, client, workspace = app
    config = demo_config(workspace, {
        "model.family": "flux2", "model.path": "tiny:flux2", "train.max_steps": "2",
        "train.checkpoint_every": "2", "train.eval_every": "2", "validation.every": "2",
        "datasets.0.vae_cache": "cache/flux2/shapes/vae", "text_cache.dir": "cache/flux2/text",
        "output.dir": "runs/flux2-api"})
    run_dir = client.predict(config, False, api_name="/launch")["run_dir"]
    done = wait_until(lambda: (s := client.predict(run_dir, api_name="/status"))
                      ["state"] in ("done", "failed") and s, 480, "the flux2 run to end")
    assert done["state"] == "done", done["log"][-20:]
    lora = Path(run_dir) / "lora"
    assert (lora / "pytorch_lora_weights.safetensors").is_file()
    assert (lora / "lora_comfyui.safetensors").is_file()
    assert (Path(run_dir) / "validation/step_000002/00.png").is_file()

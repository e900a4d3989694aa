"""`--stage merge` and ops.merge_run: the run's final LoRA fused into its base as
<output.dir>/merged/, a diffusers folder drawing what base + LoRA draws (tiny models, CPU).

The run folder is made in-process (config.toml and a LoRA saved by the family, its weights
made non-trivial), since the trainer is not what is tested here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import small_config

from core import ops
from core.config import save_config
from core.models.adapters import adapter_config
from core.models.registry import get_family
from core.models.tiny import resolve_model_path

# Per family: what the pipeline call needs besides the prompt (a short T5 for flux).
CALL = {"sd15": {}, "flux": {"max_sequence_length": 16}, "qwen_image": {}}


def make_run(tmp: Path, workspace: Path, family: str, *, lora: bool = True) -> Path:
    """A finished LoRA run's folder: config.toml (model.path tiny:<family>) and, with
    `lora`, lora/ written by the family's save_lora from a random non-zero adapter."""
    cfg = small_config(tmp, family=family)
    run = Path(cfg.output.dir)
    run.mkdir(parents=True)
    save_config(cfg, run / "config.toml")
    if lora:
        fam = get_family(family)
        c = fam.load(resolve_model_path(f"tiny:{family}", workspace))
        c.denoiser.add_adapter(adapter_config("lora", 4, 4.0, fam.lora_target_modules()))
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in c.denoiser.parameters():
                if p.requires_grad:
                    p.normal_(0, 0.3, generator=g)
        fam.save_lora(c, run / "lora")
    return run


def image(pipe: object, family: str) -> torch.Tensor:
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt="a red circle", num_inference_steps=2, height=64, width=64, output_type="np",
               generator=torch.Generator().manual_seed(0), **CALL[family])
    return torch.from_numpy(out.images[0])


def base_folder(family: str, workspace: Path) -> Path:
    return Path(resolve_model_path(f"tiny:{family}", workspace))


def base_pipeline(family: str, workspace: Path) -> object:
    """The base as a downstream tool loads it: its own folder, its own scheduler."""
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.from_pretrained(str(base_folder(family, workspace)),
                                             local_files_only=True)


# qwen_image: its validation pipeline is the family's own subclass, which merged/'s
# model_index.json must not name (DiffusionPipeline could not load it).
@pytest.mark.parametrize("family", ["sd15", "flux", "qwen_image"])
def test_merged_folder_draws_what_base_plus_lora_draws(family: str, tmp_path: Path,
                                                        tiny_workspace: Path):
    """Issue 40 item 2: with the base's own scheduler (sd15's validation pipeline samples
    with DPM-Solver, which merged/ carried and drew differently with)."""
    from diffusers import DiffusionPipeline

    run = make_run(tmp_path, tiny_workspace, family)
    merged = ops.merge_run(run, tiny_workspace)
    assert merged == run / "merged" and (merged / "model_index.json").exists()
    assert not list(merged.rglob("*lora*"))  # fused: no adapter layers or files left

    pipe = base_pipeline(family, tiny_workspace)
    base = image(pipe, family)
    pipe.load_lora_weights(str(run / "lora"))
    with_lora = image(pipe, family)
    loaded = DiffusionPipeline.from_pretrained(str(merged), local_files_only=True)
    assert type(loaded.scheduler) is type(pipe.scheduler)
    assert dict(loaded.scheduler.config) == dict(pipe.scheduler.config)
    from_merged = image(loaded, family)
    assert (with_lora - base).abs().max() > 1e-2  # the LoRA changes the picture
    assert torch.allclose(from_merged, with_lora, atol=2e-4), \
        (from_merged - with_lora).abs().max()
    # Issue 40 item 19: sd15 also as one original-layout checkpoint, which diffusers'
    # single-file loader reads back into merged/'s weights; a transformer family has none.
    checkpoint = run / "merged.safetensors"
    assert checkpoint.is_file() == (family == "sd15")
    if family == "sd15":
        from diffusers import StableDiffusionPipeline

        single = StableDiffusionPipeline.from_single_file(str(checkpoint), config=str(merged),
                                                          local_files_only=True)
        for name in ("unet", "vae", "text_encoder"):
            mine, theirs = getattr(single, name).state_dict(), getattr(loaded,
                                                                      name).state_dict()
            assert mine.keys() == theirs.keys(), name
            assert all(torch.equal(mine[k], theirs[k]) for k in mine), name
        from core.runs.outputs import downloadable_files

        assert checkpoint in downloadable_files(run)
        from ui.render import run_outputs

        assert "merged + checkpoint file" in run_outputs(run)  # the Runs table says so


@pytest.mark.parametrize("family", ["sd15", "flux", "qwen_image", "qwen_image_edit"])
def test_merged_folder_carries_every_component_file_of_the_base(
        family: str, tmp_path: Path, tiny_workspace: Path):
    """Every component the base's model_index.json names, with every file its folder
    holds (weights aside, which merged/ writes itself), and the same index entries."""
    import json

    run = make_run(tmp_path, tiny_workspace, family)
    merged = ops.merge_run(run, tiny_workspace)
    base = base_folder(family, tiny_workspace)
    weights = (".safetensors", ".bin", ".index.json")
    files = {str(p.relative_to(base)) for p in base.glob("*/*")
             if p.is_file() and not p.name.endswith(weights)}
    assert files, base
    assert sorted(f for f in files if not (merged / f).is_file()) == []
    base_index = json.loads((base / "model_index.json").read_text())
    merged_index = json.loads((merged / "model_index.json").read_text())
    assert {k: v for k, v in merged_index.items() if not k.startswith("_")} == \
        {k: v for k, v in base_index.items() if not k.startswith("_")}


def test_merged_scheduler_keeps_the_prediction_type_the_run_trained_with(
        tmp_path: Path, tiny_workspace: Path):
    """A single file read with another folder's configs and model.prediction_type set
    (an SD2-768 file): the base's scheduler, with the run's prediction type."""
    import json

    from diffusers import DPMSolverMultistepScheduler

    from core.merge import keep_base_components

    pipe = base_pipeline("sd15", tiny_workspace)
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(
        pipe.scheduler.config, prediction_type="v_prediction")
    pipe.save_pretrained(str(tmp_path / "merged"))
    keep_base_components(base_folder("sd15", tiny_workspace), tmp_path / "merged", pipe)
    config = json.loads((tmp_path / "merged/scheduler/scheduler_config.json").read_text())
    assert config["_class_name"] == "PNDMScheduler"
    assert config["prediction_type"] == "v_prediction"


def test_a_component_the_base_names_but_lacks_is_not_named_in_merged(
        tmp_path: Path, tiny_workspace: Path):
    """A hub snapshot downloaded in part (no safety_checker/ folder though its
    model_index.json names one): merged/ must not name a component it cannot hold."""
    import json
    import shutil

    from core.merge import keep_base_components

    base = tmp_path / "base"
    shutil.copytree(base_folder("sd15", tiny_workspace), base)
    index = json.loads((base / "model_index.json").read_text())
    index["safety_checker"] = ["stable_diffusion", "StableDiffusionSafetyChecker"]
    (base / "model_index.json").write_text(json.dumps(index))
    pipe = base_pipeline("sd15", tiny_workspace)
    pipe.save_pretrained(str(tmp_path / "merged"))
    keep_base_components(base, tmp_path / "merged", pipe)
    merged = json.loads((tmp_path / "merged/model_index.json").read_text())
    assert merged["safety_checker"] == [None, None]


@pytest.fixture(scope="module")
def base_image(tiny_workspace: Path) -> torch.Tensor:
    return image(base_pipeline("sd15", tiny_workspace), "sd15")


def _cli(run: Path, workspace: Path, *extra: str) -> int:
    from app import main

    return main(["--no-ui", "--workspace", str(workspace), "--config",
                 str(run / "config.toml"), "--stage", "merge", *extra])


# Each way a scale reaches the merge: ops.merge_run's argument, the run's own
# merge.lora_scale (no argument), `--stage merge --set merge.lora_scale=0`, and the Runs
# tab's handler given its field's value (the browser test below types it in the field).
@pytest.mark.parametrize("how", ["argument", "run_config", "cli_set", "runs_tab"])
def test_lora_scale_zero_merges_to_the_base(how: str, tmp_path: Path, tiny_workspace: Path,
                                            base_image: torch.Tensor,
                                            capsys: pytest.CaptureFixture[str]):
    from diffusers import DiffusionPipeline

    from core.config import load_config

    run = make_run(tmp_path, tiny_workspace, "sd15")
    if how == "argument":
        ops.merge_run(run, tiny_workspace, lora_scale=0.0)
    elif how == "run_config":
        cfg = load_config(run / "config.toml")
        cfg.merge.lora_scale = 0.0
        save_config(cfg, run / "config.toml")
        ops.merge_run(run, tiny_workspace)
    elif how == "cli_set":
        assert _cli(run, tiny_workspace, "--set", "merge.lora_scale=0") == 0
        assert "merged model (base + LoRA at scale 0)" in capsys.readouterr().out
    else:
        from ui.context import AppContext
        from ui.tab_runs_merge import merge_message

        context = AppContext(tiny_workspace, monitor=False)
        try:
            assert "merged (base + LoRA at scale 0)" in merge_message(context, str(run), 0.0)
        finally:
            context.close()
    got = image(DiffusionPipeline.from_pretrained(str(run / "merged"), local_files_only=True),
                "sd15")
    assert torch.allclose(got, base_image, atol=2e-4), (got - base_image).abs().max()


def test_cli_merges_once_then_refuses_to_overwrite(tmp_path: Path, tiny_workspace: Path,
                                                   capsys: pytest.CaptureFixture[str]):
    run = make_run(tmp_path, tiny_workspace, "sd15")
    assert _cli(run, tiny_workspace) == 0
    assert f"merged model (base + LoRA at scale 1): {run / 'merged'}" in capsys.readouterr().out
    stamp = (run / "merged" / "model_index.json").stat().st_mtime_ns
    assert _cli(run, tiny_workspace, "--set", "merge.lora_scale=0.5") == 2
    err = capsys.readouterr().err
    assert f"{run / 'merged'} exists already; nothing was overwritten" in err
    assert (run / "merged" / "model_index.json").stat().st_mtime_ns == stamp


def test_cli_refuses_a_run_without_a_final_lora(tmp_path: Path, tiny_workspace: Path,
                                                capsys: pytest.CaptureFixture[str]):
    run = make_run(tmp_path, tiny_workspace, "sd15", lora=False)
    assert _cli(run, tiny_workspace) == 2
    err = capsys.readouterr().err
    assert f"the run in {run} has no final LoRA" in err and "Traceback" not in err
    assert not (run / "merged").exists()
    empty = tmp_path / "elsewhere"
    with pytest.raises(ops.OpError, match=f"{empty} holds no run"):
        ops.merge_run(empty, tiny_workspace)


@pytest.mark.slow
def test_runs_tab_merge_button_merges_then_refuses_beside_the_button(
        tmp_path: Path, base_image: torch.Tensor):
    """In Chromium: the Runs tab's button merges the chosen run at the scale typed in its
    field (0: merged/ draws what the base draws); a second click is refused in the message
    beside it (merged/ is kept), not in an error toast."""
    import time

    from diffusers import DiffusionPipeline
    from playwright.sync_api import sync_playwright
    from test_ui_support import CHROMIUM_ARGS, chromium, running_app

    from core.runs.registry import RunRecord, register_run
    from core.runs.status import write_status

    executable = chromium()
    workspace = tmp_path / "ws"
    run = make_run(workspace, workspace, "sd15")
    write_status(run, state="done", step=10, max_steps=10)
    register_run(workspace, RunRecord(str(run.resolve()), started_at=time.time()))
    message = "document.querySelector('#runs-merge-message').innerText"
    with running_app(workspace) as (_ctx, url), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(120_000)
        try:
            page.goto(url)
            page.get_by_role("tab", name="Runs").click()
            page.wait_for_function("document.querySelector('#runs-table').innerText"
                                   ".includes('runs/run')")
            page.fill("#f-merge-lora_scale input", "0")
            page.press("#f-merge-lora_scale input", "Tab")
            page.click("#runs-merge")
            page.wait_for_function(f"{message}.includes('merged (base + LoRA')")
            text = page.inner_text("#runs-merge-message")
            assert "at scale 0): runs/run/merged, a diffusers folder and "\
                   "runs/run/merged.safetensors, one checkpoint file" in text, text
            # Issue 40 item 19: the run's files list the merged model for download.
            page.click("#runs-file input")
            page.get_by_role("option", name="runs/run/merged.safetensors").click()
            page.wait_for_function("document.querySelector('#runs-download')"
                                   ".innerText.includes('merged.safetensors')")
            got = image(DiffusionPipeline.from_pretrained(str(run / "merged"),
                                                          local_files_only=True), "sd15")
            assert torch.allclose(got, base_image, atol=2e-4), (got - base_image).abs().max()
            page.click("#runs-merge")
            page.wait_for_function(f"{message}.includes('exists already')")
            text = page.inner_text("#runs-merge-message")
            assert "exists already (merged before the run was extended?); nothing was "\
                   "overwritten: tick" in text, text
            assert page.locator(".toast-body").count() == 0
            # Issue 54 item 4: Extend then Merge: the box beside the button replaces it.
            stale = run / "merged" / "stale.txt"
            stale.write_text("from before the extension")
            page.check("#runs-merge-replace input")
            page.click("#runs-merge")
            page.wait_for_function(f"{message}.includes('merged (base + LoRA')")
            assert not stale.exists()
            assert not page.is_checked("#runs-merge-replace input")  # asked again next time
            # ... and the merged model leaves the machine whole, as one .zip.
            page.click("#runs-file input")
            page.get_by_role("option", name="runs/run/merged/ (the whole merged model, "
                                            "one .zip)").click()
            page.wait_for_function("document.querySelector('#runs-download')"
                                   ".innerText.includes('run-merged.zip')")
            assert (workspace / ".downloads/runs/run/run-merged.zip").is_file()
        finally:
            page.screenshot(path=str(tmp_path / "merge.png"), full_page=True)
            browser.close()


def test_merge_refuses_a_live_run_and_a_full_fine_tune(tmp_path: Path, tiny_workspace: Path):
    from core.runs.status import write_status

    run = make_run(tmp_path / "live", tiny_workspace, "sd15")
    write_status(run, state="running", step=3, max_steps=10)
    with pytest.raises(ops.OpError, match=f"the run in {run} is running; merge it once"):
        ops.merge_run(run, tiny_workspace)
    full = make_run(tmp_path / "full", tiny_workspace, "sd15", lora=False)
    (full / "model").mkdir()
    with pytest.raises(ops.OpError, match="is a full fine-tune"):
        ops.merge_run(full, tiny_workspace)
    assert not (run / "merged").exists() and not (full / "merged").exists()


def test_demo_merge_finds_the_run_the_demo_trained_last(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]):
    """Issue 40 item 4: each demo run moves on to a free runs/demo-N, so `--preset demo
    --stage merge` must merge the run just trained, not refuse on the preset's folder (or
    merge the first run); the latest is the one written last, not the highest number."""
    import os

    from conftest import app_in_process

    runs = tmp_path / "runs"
    runs.mkdir()
    for n, name in enumerate(("demo-3", "demo", "demo-2")):  # demo-2 reused after a delete
        made = make_run(tmp_path / "made" / name, tmp_path, "sd15")
        made.rename(runs / name)
        os.utime(runs / name / "config.toml", ns=(n * 10**9, n * 10**9))
    done = app_in_process("--no-ui", "--preset", "demo", "--stage", "merge",
                          "--workspace", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"merged model (base + LoRA at scale 1): {runs / 'demo-2' / 'merged'}" in done.stdout
    assert [p.parent.name for p in runs.glob("*/merged")] == ["demo-2"]
    assert not (tmp_path / "demo").exists(), "a merge generates no demo images"
    again = app_in_process("--no-ui", "--preset", "demo", "--stage", "merge",
                           "--workspace", str(tmp_path))
    assert again.returncode == 2 and f"{runs / 'demo-2' / 'merged'} exists already" \
        in again.stderr


def test_demo_resume_continues_the_run_the_demo_trained_last(tmp_path: Path) -> None:
    from argparse import Namespace

    from core.headless import demo_notes
    from core.ops import load_run_config

    for name in ("demo", "demo-2"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "config.toml").write_text("version = 1\n")
    cfg = load_run_config(None, "demo", [])
    args = Namespace(preset="demo", stage="all", resume="latest")
    notes = demo_notes(args, cfg, tmp_path)
    assert cfg.output.dir == "runs/demo-2"
    assert f"the demo's latest run is {tmp_path / 'runs/demo-2'}" in notes[-1]

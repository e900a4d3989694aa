"""The UI's gradio-free parts: form <-> config, saved configs the CLI accepts, cache
status and clearing, the run follower and the validation-image watcher."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import gradio as gr
import pytest
from conftest import check_in_process, small_config

from core.config import DatasetConfig, dumps_config, load_config
from core.presets import list_presets, preset_path
from core.runs.follow import RunFollower
from core.runs.status import append_event, write_status
from ui.state import (
    DatasetList,
    build_config,
    config_values,
    dataset_values,
    new_dataset,
    with_editor,
)


def form_of(cfg):
    """What the form holds for `cfg`: the dataset list, editor values, field values."""
    datasets = DatasetList(list(cfg.datasets), 0)
    return datasets, dataset_values(datasets.current()), config_values(cfg)


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_survives_the_form_unchanged(name):
    cfg = load_config(preset_path(name))
    back, problems = build_config(*form_of(cfg))
    assert problems == []
    assert dumps_config(back) == dumps_config(cfg)


def test_editor_values_win_over_the_stored_dataset_and_empty_numbers_are_named():
    cfg = load_config(preset_path("demo"))
    datasets, editor, values = form_of(cfg)
    editor["resolution"] = 64.0  # gr.Number gives floats
    editor["repeats"] = None  # the user cleared the box
    values["train.max_steps"] = 8
    values["validation.prompts"] = "a red circle\n\n  a blue square  \n"
    back, problems = build_config(datasets, editor, values)
    assert back.datasets[0].resolution == 64 and isinstance(back.datasets[0].resolution, int)
    assert back.train.max_steps == 8
    assert back.validation.prompts == ["a red circle", "a blue square"]
    assert [(p.level, p.where) for p in problems] == [("error", "datasets.0.repeats")]
    assert "is empty" in problems[0].message
    values["train.learning_rate"] = 2.5
    values["train.batch_size"] = 2.5
    _, problems = build_config(datasets, editor, values)
    assert any(p.where == "train.batch_size" and "whole number" in p.message for p in problems)


def test_new_datasets_get_unique_ids_and_their_own_cache_folders():
    items = [DatasetConfig(id="data2", images="a", vae_cache="cache/a")]
    first = new_dataset(items)
    items.append(first)
    second = new_dataset(items)
    assert len({d.id for d in (*items, second)}) == 3
    assert len({d.vae_cache for d in (*items, second)}) == 3
    datasets = DatasetList(items, 1)
    edited, _ = with_editor(datasets, {**dataset_values(first), "id": "renamed"})
    assert edited.items[1].id == "renamed" and datasets.items[1].id == first.id, "a copy"


def test_saved_form_is_accepted_unchanged_by_the_cli(tmp_path):
    from ui.context import AppContext
    from ui.presets import load_source, save_named

    ctx = AppContext(tmp_path / "ws", monitor=False)
    cfg, notes = load_source(ctx, "preset: demo")
    assert (tmp_path / "ws/demo/shapes").is_dir() and "demo images" in notes[-1]
    cfg.train.max_steps = 8
    path = save_named(ctx, cfg, "my-run")
    assert path == tmp_path / "ws/configs/my-run.toml"
    assert path.read_text() == dumps_config(cfg)
    done = check_in_process("--config", str(path), "--workspace", str(tmp_path / "ws"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dataset 'shapes': 72 image(s)" in done.stdout


# ---------------------------------------------------------------- cache status and clear


def test_cache_status_counts_cached_stale_missing_and_clear_keeps_images(tmp_path):
    import torch

    from core.cache.clear import ClearRefused, clear_dataset_cache, find_cache_files
    from core.cache.plan import plan_caches
    from core.cache.status import cache_status
    from core.cache.store import atomic_save

    cfg = small_config(tmp_path, images=4)
    cfg.model.path = "org/model"  # a hub id: its identity needs no download
    status = cache_status(cfg, tmp_path)
    ds = status.datasets[0]
    assert (ds.images, ds.vae.missing, ds.text.missing) == (4, 4, 4) and status.model_known
    plan = plan_caches(cfg, {"family": "sd15", "model": _fingerprint("org/model")})
    for job in plan.vae_jobs[:2]:
        atomic_save({"latents": torch.zeros(4, 8, 8)}, job.meta, job.entry)
    ds = cache_status(cfg, tmp_path).datasets[0]
    assert (ds.vae.cached, ds.vae.stale, ds.vae.missing) == (2, 0, 2)
    image = plan.vae_jobs[0].image
    os.utime(image, ns=(time.time_ns(), time.time_ns() + 10**9))  # the image changed
    ds = cache_status(cfg, tmp_path).datasets[0]
    assert (ds.vae.cached, ds.vae.stale, ds.vae.missing) == (1, 1, 2)

    cache_dir = Path(cfg.datasets[0].vae_cache)
    (cache_dir / "notes.md").write_text("mine")  # not a cache file: must survive
    assert len(find_cache_files(cfg.datasets[0], cfg).files) == 2
    removed = clear_dataset_cache(cfg.datasets[0], cfg)
    assert len(removed.files) == 2 and (cache_dir / "notes.md").exists()
    assert not any(p.exists() for p in removed.files), "cleared: the entries are gone"
    ds = cache_status(cfg, tmp_path).datasets[0]
    assert (ds.vae.cached, ds.vae.stale, ds.vae.missing) == (0, 0, 4)
    assert sorted(p.name for p in (tmp_path / "data0").glob("*.png")) == [
        f"img_{i:03d}.png" for i in range(4)], "images untouched"
    cfg.datasets[0].vae_cache = str(tmp_path / "data0" / "latents")  # inside the images
    with pytest.raises(ClearRefused, match="overlaps the images folder"):
        clear_dataset_cache(cfg.datasets[0], cfg)


def _fingerprint(path: str) -> str:
    from core.models.loading import fingerprint

    return fingerprint(path, "hub")


def test_cache_status_without_a_built_tiny_model_says_why(tmp_path):
    from core.cache.status import cache_status

    cfg = small_config(tmp_path, images=2)
    status = cache_status(cfg, tmp_path / "ws")
    assert not status.model_known and "tiny model is not built yet" in status.note
    assert status.datasets[0].vae.missing == 2


# ---------------------------------------------------------------- following a run


def test_follower_reads_only_new_bytes_collapses_progress_and_tracks_losses(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    log = run / "train.log"
    log.write_text("old run line\n")
    offset = log.stat().st_size
    with open(log, "a") as fh:
        fh.write("loading\ncache 1/3\rcache 2/3\rcache 3/3\nstep 1/4 loss 1.0\npartial 5")
    write_status(run, state="running", step=1, max_steps=4, eta_s=3.0)
    append_event(run, {"type": "step", "step": 1, "loss": 1.0, "it_s": 2.0, "eta_s": 1.5})
    f = RunFollower(run, log_offset=offset).poll()
    assert list(f.lines) == ["loading", "cache 3/3", "step 1/4 loss 1.0"]
    assert f.partial == "partial 5" and f.log_text().endswith("partial 5")
    assert (f.progress.state, f.progress.step, f.progress.max_steps) == ("running", 1, 4)
    assert f.progress.it_s == 2.0 and f.losses == [(1, 1.0)]
    versions = (f.log_version, f.plot_version)
    f.poll()
    assert (f.log_version, f.plot_version) == versions, "nothing new, nothing changed"
    with open(log, "a") as fh:
        fh.write("0%\n")
    append_event(run, {"type": "eval", "step": 1, "loss": 0.9, "loss_shuffled": 0.95})
    write_status(run, state="done", step=4)
    f.poll()
    assert list(f.lines)[-1] == "partial 50%" and f.partial == ""
    assert f.plot_version > versions[1]
    assert ("eval", 0.9) in [(s, v) for _, s, v in f.evals]
    assert f.progress.final and f.progress.eta_s is None
    assert [r[2] for r in f.plot_rows()] == ["train", "eval", "eval (shuffled captions)"]


def test_every_plot_frame_names_every_series_so_train_steps_after_the_eval_show(tmp_path):
    """The browser keeps the colours of the first frame's series: the step-0 eval comes
    first, so the train steps that follow must be a series the first frame named."""
    import math

    from ui.run_views import Following, plot_frame

    run = tmp_path / "run"
    run.mkdir()
    f = Following(RunFollower(run, log_offset=0))
    assert set(plot_frame(f)["series"]) == {"train", "eval", "eval (shuffled captions)"}
    append_event(run, {"type": "eval", "step": 0, "loss": 0.5, "loss_shuffled": 0.52})
    f.follower.poll()
    first = plot_frame(f)
    assert set(first["series"]) == {"train", "eval", "eval (shuffled captions)"}
    assert all(math.isnan(v) for v in first[first["series"] == "train"]["loss"])
    for step in (1, 2, 3):
        append_event(run, {"type": "step", "step": step, "loss": 1.0 / step})
    f.follower.poll()
    mid = plot_frame(f)
    train = mid[mid["series"] == "train"]
    assert list(train["step"]) == [1, 2, 3] and list(train["loss"]) == [1.0, 0.5, 1 / 3]
    assert str(mid["step"].dtype) == "int64" and str(mid["loss"].dtype) == "float64"


def test_watcher_sees_a_renamed_png_at_once_and_ignores_temp_files(tmp_path):
    from PIL import Image

    from ui.watch import GalleryWatcher

    run = tmp_path / "run"
    (run / "validation/step_000002").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(run / "validation/step_000002/00.png")
    watcher = GalleryWatcher(run, rescan_s=3600).start()
    try:
        version, items = watcher.snapshot()
        assert [(i.step, i.index) for i in items] == [(2, 0)]
        folder = run / "validation/step_000004"
        folder.mkdir()
        tmp = folder / ".01.png.tmp"
        Image.new("RGB", (8, 8)).save(tmp, format="PNG")
        time.sleep(0.3)
        assert watcher.snapshot()[0] == version, "a temp file is not an image yet"
        t0 = time.monotonic()
        os.replace(tmp, folder / "01.png")
        while watcher.snapshot()[0] == version and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        seen_after = time.monotonic() - t0
        items = watcher.snapshot()[1]
        assert [(i.step, i.index) for i in items] == [(4, 1), (2, 0)], "newest step first"
        assert seen_after < 1.0, f"the watcher took {seen_after:.2f}s"
    finally:
        watcher.stop()


def test_cache_progress_gives_an_eta_from_the_events(tmp_path):
    from core.cache.job import CacheProgress

    progress = CacheProgress()
    progress.update({"type": "cache_progress", "kind": "vae", "done": 4, "total": 20}, 10.0)
    assert progress.kinds["vae"].eta_s() is None, "no rate from a single event"
    progress.update({"type": "cache_progress", "kind": "vae", "done": 12, "total": 20}, 12.0)
    assert progress.kinds["vae"].eta_s() == pytest.approx(2.0)
    progress.update({"type": "cache_progress", "kind": "vae", "done": 20, "total": 20}, 13.0)
    assert progress.kinds["vae"].eta_s() == 0.0


def test_reproduce_lines_name_the_saved_config_and_hide_secrets(tmp_path):
    from ui.actions import reproduce_lines
    from ui.context import AppContext

    ctx = AppContext(tmp_path / "ws", secrets=["hunter2"], monitor=False)
    run = ctx.workspace / "runs/demo"
    run.mkdir(parents=True)
    (run / "command.txt").write_text("accelerate launch x --token=hunter2 hf_"
                                     + "a" * 30 + "\n")
    text = reproduce_lines(ctx, run)
    assert "hunter2" not in text and "hf_aaaa" not in text
    assert f"--config {run / 'config.toml'}" in text and "--resume" in text
    assert "--set output.dir=runs/demo-new" in text
    json.dumps(text)  # plain text, safe for any component


def test_cache_progress_sums_the_shares_of_every_process():
    from core.cache.job import CacheProgress

    progress = CacheProgress()
    for process, done in ((0, 3), (1, 2), (0, 5)):
        progress.update({"type": "cache_progress", "kind": "vae", "process": process,
                         "done": done, "total": 5}, float(done))
    vae = progress.kinds["vae"]
    assert (vae.done, vae.total) == (7, 10), "two shares of 5: process 0 done, 1 at 2"


def test_every_config_key_has_a_form_field_with_its_label_and_help(tmp_path):
    """Field metadata drives the form: each section key and each dataset key shows, with
    its label and help, so a key added to the schema (caption dropout, noise offset,
    tag shuffling, TensorBoard...) reaches the UI."""
    from dataclasses import fields

    from core.config.schema import SECTION_TYPES, DatasetConfig
    from ui.app import build_app
    from ui.context import AppContext

    ctx = AppContext(tmp_path / "ws", monitor=False)
    try:
        page = build_app(ctx)
    finally:
        ctx.close()
    by_id = {c.elem_id: c for c in page.blocks.values() if getattr(c, "elem_id", None)}
    wanted = {f"f-{section}-{f.name}": f for section, tp in SECTION_TYPES.items()
              for f in fields(tp)}
    wanted |= {f"ds-{f.name}": f for f in fields(DatasetConfig)}
    assert sorted(set(wanted) - set(by_id)) == []
    for elem_id, f in wanted.items():
        component = by_id[elem_id]
        assert component.label == f.metadata["label"], elem_id
        if f.metadata["help"]:
            assert component.info == f.metadata["help"], elem_id


def test_a_lone_step_0_eval_is_not_a_drawable_loss_plot() -> None:
    """The plot waits for a series' second point: one point draws an empty frame."""
    from ui.run_views import drawable

    nan = float("nan")
    assert not drawable([(0, 0.5, "eval"), (0, nan, "train")])
    assert drawable([(0, 0.5, "eval"), (1, 0.4, "train"), (2, 0.3, "train")])


def test_a_check_before_the_page_opened_saves_nothing_over_the_persons_form(tmp_path):
    """Gradio may fire a change with the page's blank defaults before the opening fill
    arrives; that check would save a blank form over the one the person left (the next
    refresh restored it: a clean-clone run saw "images is empty" on a reloaded page)."""
    from ui.app import build_app
    from ui.context import AppContext
    from ui.presets import FORM_FILE

    ws = tmp_path / "ws"
    ctx = AppContext(ws, monitor=False)
    try:
        demo = build_app(ctx)
        [check] = [d for d in demo.fns.values() if d.fn and d.fn.__name__ == "live_check"][:1]
        blank = {c: copy.deepcopy(c.value) for c in check.inputs}
        saved = ws / FORM_FILE
        saved.write_text("# the person's form\n", encoding="utf-8")
        out = check.fn(blank)
        assert saved.read_text(encoding="utf-8") == "# the person's form\n"
        assert out == gr.skip(), "nor is the blank form checked"
    finally:
        ctx.close()


def test_the_training_tab_shows_why_a_killed_trainer_failed(tmp_path):
    """A trainer killed by SIGKILL under the launcher (exit 137), finalized as the run
    manager does: the Training tab's progress line carries the reason whole (signal,
    what it often is, the last step, the memory peak)."""
    from core.runs.final_state import finalize_run
    from core.runs.folder import RunFolder
    from ui.render import esc, run_progress_html

    run = tmp_path / "run"
    write_status(run, state="running", step=6, max_steps=50)
    for step in (6, 7):
        append_event(run, {"type": "step", "step": step, "loss": 0.5})
    append_event(run, {"type": "memory", "phase": "first_step", "device_bytes": None,
                       "device_peak_bytes": None, "host_rss_bytes": 3 * 1024 ** 3})
    assert finalize_run(RunFolder(run), 128 + 9) == "failed"
    progress = RunFollower(run, log_offset=0).poll().progress
    assert progress.state == "failed" and progress.step == 7
    assert progress.reason.startswith("the training process was killed by signal 9 (often "
                                      "the out-of-memory killer: ")
    assert "at step 7/50; memory: peak 3.0 GiB host RSS" in progress.reason
    assert esc(progress.reason) in run_progress_html(progress, "runs/run")

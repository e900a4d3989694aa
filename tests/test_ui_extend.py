"""The web UI's side of Extend and Open: Resume on a finished run says to Extend,
Extend trains on to the form's Max steps, Open and follow puts the run's settings in the
form; a bad imported config is named as the user's file, not Gradio's temp copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from core import ops
from core.runs.folder import LORA_WEIGHTS_NAME, RunFolder
from tests.fixtures.fake_trainer import save_fake_checkpoint
from tests.test_ops import fake_trainer, workspace_config  # noqa: F401 (a fixture)


@pytest.mark.slow
def test_open_fills_the_form_and_resume_of_a_done_run_offers_extend(
        tmp_path: Path, fake_trainer):  # noqa: F811
    import gradio as gr

    from ui import actions, tab_runs, tab_train
    from ui.context import AppContext
    from ui.form import Form

    workspace = tmp_path / "ws"
    cfg = workspace_config(workspace, processes=1)
    cfg.train.max_steps, cfg.train.lora_rank = 40, 8  # the stand-in trains 40 steps
    ctx = AppContext(workspace, monitor=False)
    try:
        first = ops.launch(cfg, workspace)
        assert first.handle.wait(timeout=120) == "done"
        run_dir = first.run_dir
        save_fake_checkpoint(run_dir, 40)  # the stand-in resumes here
        (RunFolder(run_dir).lora).mkdir(exist_ok=True)
        (RunFolder(run_dir).lora_weights).write_bytes(b"final of step 40")
        with gr.Blocks():
            form = Form()
            train = tab_train.build(form)
            runs = tab_runs.build()
        out = tab_runs.open_view(ctx, runs, train, form, str(run_dir))
        assert out[form.fields["train.max_steps"]] == 40
        assert out[form.fields["train.lora_rank"]] == 8
        assert out[form.fields["output.dir"]] == "runs/r"
        assert out[train.following].run_dir == run_dir

        with pytest.raises(actions.ActionError) as refused:
            actions.resume(ctx, run_dir)
        assert "Extend" in refused.value.message and "Max steps" in refused.value.message
        launched = actions.extend(ctx, run_dir, 80)
        assert launched.handle.wait(timeout=120) == "done"
        assert (RunFolder(run_dir).lora_step(40) / LORA_WEIGHTS_NAME).read_bytes() == \
            b"final of step 40"
    finally:
        ctx.close()


def test_a_bad_imported_config_is_named_by_its_file_name_not_gradios_temp_path(
        tmp_path: Path):
    from ui import presets
    from ui.actions import ActionError

    upload = tmp_path / ".gradio" / "3f2a9c" / "my-run.toml"  # where Gradio keeps uploads
    upload.parent.mkdir(parents=True)
    upload.write_text("version = 1\n[train\n", encoding="utf-8")
    with pytest.raises(ActionError) as refused:
        presets.read_config_file(upload, shown_as=presets.uploaded_name(upload))
    shown = refused.value.message + "".join(str(p) for p in refused.value.problems)
    assert "my-run.toml" in shown and "not valid TOML" in shown
    assert "3f2a9c" not in shown and ".gradio" not in shown


def test_the_dataset_preview_pages_through_72_images_and_shows_full_captions(
        tmp_path: Path):
    import gradio as gr

    from core.config import Config, DatasetConfig
    from tests.conftest import write_shapes
    from ui import tab_dataset
    from ui.context import AppContext
    from ui.form import Form

    write_shapes(tmp_path / "data/a", 72, size=(16, 16))
    long_caption = "a red circle " + "on a very long and detailed background, " * 8 + "END"
    last = sorted((tmp_path / "data/a").glob("*.png"))[-1]
    last.with_suffix(".txt").write_text(long_caption, encoding="utf-8")
    cfg = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a")])
    with gr.Blocks():
        tab = tab_dataset.build(Form())
    ctx = AppContext(tmp_path, monitor=False)
    try:
        first = tab_dataset.preview_view(ctx, tab, cfg, 0)
        assert first[tab.preview_note].startswith("Images 1-48 of 72")
        assert len(first[tab.preview]) == 48 and first[tab.page] == 0
        second = tab_dataset.preview_view(ctx, tab, cfg, 0, first[tab.page] + 1)
        assert second[tab.preview_note].startswith("Images 49-72 of 72")
        assert len(second[tab.preview_paths]) == 24 and second[tab.page] == 1
        assert second[tab.preview_paths][-1] == str(last)
        assert [last.name, long_caption] in second[tab.captions]  # whole, not cut
        beyond = tab_dataset.preview_view(ctx, tab, cfg, 0, 5)  # clamped to the last page
        assert beyond[tab.page] == 1
    finally:
        ctx.close()


def test_the_cache_tab_says_when_the_last_build_was_for_other_cache_folders(
        tmp_path: Path):
    from types import SimpleNamespace

    import gradio as gr

    from core.config import Config, DatasetConfig, save_config
    from tests.conftest import write_shapes
    from ui import tab_cache
    from ui.context import AppContext
    from ui.form import Form

    write_shapes(tmp_path / "data/a", 2)
    built = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a")])
    job_dir = tmp_path / ".cache-jobs/20250101-000000-abc123"
    save_config(built, job_dir / "config.toml")
    job = SimpleNamespace(job_dir=job_dir, folder=RunFolder(job_dir, kind="cache"),
                          progress=SimpleNamespace(kinds={}), poll=lambda: "done")
    with gr.Blocks():
        tab = tab_cache.build(Form())
    ctx = AppContext(tmp_path, monitor=False)
    ctx.cache_job = job  # the app's last build: done, for cache/a
    try:
        other = Config(datasets=[DatasetConfig(id="b", images="data/a", vae_cache="cache/b")])
        shown = tab_cache.refresh_view(ctx, tab, other)[tab.progress]
        assert "done" in shown and "cache/a" in shown
        assert "did not build the form" in shown and "cache/b" in shown
        same = tab_cache.refresh_view(ctx, tab, built)[tab.progress]
        assert "done" in same and "did not build" not in same
    finally:
        ctx.close()

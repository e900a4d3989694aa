"""The form's handlers called directly (no server): the form kept across a page refresh,
Export under the Save-as name, the upload box adding a dataset, a rename reaching the
dataset list, the editor disabled without a dataset, the cache table's legend."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import write_shapes

from core.config import Config, DatasetConfig, load_config
from core.presets import preset_path
from ui.context import AppContext


@pytest.fixture
def ctx(tmp_path: Path):
    context = AppContext(tmp_path / "ws")
    context.workspace.mkdir(parents=True, exist_ok=True)
    yield context
    context.close()


@pytest.fixture(scope="module")
def page():
    """The Dataset tab's components in a Blocks that is never served."""
    import gradio as gr

    from ui import tab_dataset
    from ui.form import Form

    with gr.Blocks():
        form = Form()
        tab = tab_dataset.build(form)
        form.section("model")
    return form, tab


def form_data(form, datasets, selected: int = 0, extra: dict | None = None) -> dict:
    from core.config import Config
    from ui.state import DatasetList, config_values, dataset_values

    lst = DatasetList(list(datasets), selected)
    values = dataset_values(lst.current())
    data = {form.datasets: lst, form.selector: selected}
    data.update({c: values[name] for name, c in form.editor.items()})
    defaults = config_values(Config())  # the other fields as a new form shows them
    data.update({c: defaults[key] for key, c in form.fields.items()})
    data.update(extra or {})
    return data


def test_the_form_is_kept_on_every_edit_and_restored_when_the_page_opens(ctx):
    from ui import presets

    cfg = load_config(preset_path("demo"))
    cfg.datasets[0].id = "renamed"
    assert presets.remember(ctx, cfg) is True
    assert presets.remember(ctx, cfg) is False, "unchanged: not rewritten"
    back, notes, restored = presets.opening(ctx)
    assert restored and back.datasets[0].id == "renamed"
    assert ".ui-form.toml" in notes[0]
    (ctx.workspace / presets.FORM_FILE).write_text("version = 1\n[nope]\n")
    demo, notes, restored = presets.opening(ctx)
    assert not restored and "could not be read" in notes[0]
    assert demo.datasets and len(list((ctx.workspace / "demo/shapes").glob("*.png"))) == 72


def test_without_a_kept_form_the_page_opens_on_the_demo_preset(ctx):
    from ui import presets

    cfg, notes, restored = presets.opening(ctx)
    assert not restored and notes[0].startswith("loaded demo")
    assert [d.id for d in cfg.datasets] == ["shapes"]


def test_export_writes_the_save_as_name(ctx):
    from ui import presets
    from ui.actions import ActionError

    path = presets.export(ctx, load_config(preset_path("demo")), "my-run")
    assert path == ctx.workspace / "configs/exports/my-run.toml"
    assert "[[datasets]]" in path.read_text()
    with pytest.raises(ActionError, match="config name"):
        presets.export(ctx, Config(), "../evil")


def test_upload_adds_and_selects_a_dataset_with_its_cache_outside(ctx, page, tmp_path):
    from core.check import run_check
    from ui import tab_upload
    from ui.state import build_config

    form, tab = page
    src = tmp_path / "dropped"
    files = [str(p) for p in write_shapes(src, 4)]
    files += [str(p.with_suffix(".txt")) for p in map(Path, files)]
    (src / "readme.md").write_text("hi")
    existing = DatasetConfig(id="cats", images="data/cats", vae_cache="cache/cats/vae")
    box = tab.upload
    data = form_data(form, [existing], extra={box.name: "cats", box.files: [
        *files, str(src / "readme.md")]})
    out = tab_upload.on_upload(ctx, form, box, data)
    datasets = out[form.datasets]
    assert datasets.selected == 1
    new = datasets.items[1]
    # the id "cats" is taken: the new one and its latent cache get their own names
    assert (new.id, new.images, new.vae_cache) == ("cats-2", "datasets/cats",
                                                    "cache/cats-2/vae")
    assert len(list((ctx.workspace / "datasets/cats").glob("*.png"))) == 4
    message = out[box.message]
    assert "copied 4 image(s) and 4 caption(s)" in message and "readme.md" in message
    editor = {name: out[c]["value"] for name, c in form.editor.items()}  # as shown
    assert editor["images"] == "datasets/cats"
    cfg, _ = build_config(datasets, editor, {})
    report = run_check(cfg, ctx.workspace, estimate=False)
    assert not [p for p in report.problems
                if p.level == "error" and p.where.startswith("datasets.1")], report


def test_upload_of_no_image_is_refused_and_says_what_was_skipped(ctx, page, tmp_path):
    from ui import tab_upload
    from ui.actions import ActionError

    form, tab = page
    (tmp_path / "a.pdf").write_bytes(b"%PDF")
    data = form_data(form, [], extra={tab.upload.name: "x",
                                      tab.upload.files: [str(tmp_path / "a.pdf")]})
    with pytest.raises(ActionError, match="a.pdf"):
        tab_upload.on_upload(ctx, form, tab.upload, data)
    assert not (ctx.workspace / "datasets/x").exists()


def test_renaming_updates_the_list_and_no_dataset_disables_the_editor(page):
    from ui import tab_dataset
    from ui.state import DatasetList

    form, _ = page
    data = form_data(form, [DatasetConfig(id="shapes", images="a", vae_cache="b")])
    data[form.editor["id"]] = "triangles"
    radio = tab_dataset.on_rename(form, data)[form.selector]
    assert radio.choices == [("1. triangles", 0)]
    empty = form.editor_updates(DatasetList())
    assert all(empty[c]["interactive"] is False for c in form.editor.values())
    full = form.editor_updates(DatasetList([DatasetConfig(id="a")], 0))
    assert all(full[c]["interactive"] is True for c in form.editor.values())


def test_the_cache_table_says_what_its_text_columns_count(ctx):
    from ui import tab_cache

    cfg = Config(datasets=[DatasetConfig(id="a", images="data/a", vae_cache="cache/a")])
    cfg.model.path = "tiny:sd15"
    write_shapes(ctx.workspace / "data/a", 4, captions=["same caption"])
    tab = SimpleNamespace(table="table", note="note")
    out = tab_cache.status_view(ctx, tab, cfg)
    rows = out["table"].value["data"]
    assert rows[0][1] == 4 and rows[0][7] == 1  # 4 images, 1 caption
    assert out["table"].headers[1] == "images"  # an image family's (a video's: samples)
    assert "distinct captions" in out["note"]


def test_the_dataset_editor_has_the_advanced_keys_and_reads_them_into_the_config(page):
    form, _ = page
    assert {"masks", "regularization"} <= set(form.editor)  # from the schema's metadata
    data = form_data(form, [DatasetConfig(id="shapes", images="a", vae_cache="b")])
    data[form.editor["masks"]] = "masks/shapes"
    data[form.editor["regularization"]] = True
    cfg, problems = form.read(data)
    assert not problems
    assert (cfg.datasets[0].masks, cfg.datasets[0].regularization) == ("masks/shapes", True)


def test_the_memory_line_is_made_once_for_pages_asking_at_the_same_time(ctx, monkeypatch):
    """An opening asks for the line from the page load and from the fill at once (and a
    second session opens the same preset): one estimate, the others wait and reuse it."""
    import threading

    import core.ops
    from ui.tab_train import MemoryLines, memory_view

    made = []
    real_estimate = core.ops.estimate_memory

    def counted(*args, **kwargs):
        made.append(threading.get_ident())
        return real_estimate(*args, **kwargs)

    monkeypatch.setattr(core.ops, "estimate_memory", counted)
    cfg, lines, texts = load_config(preset_path("demo")), MemoryLines(), []
    askers = [threading.Thread(target=lambda: texts.append(memory_view(ctx, cfg, lines)))
              for _ in range(3)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    assert len(made) == 1, f"{len(made)} estimates for one config"
    assert len(set(texts)) == 1 and "GiB of RAM" in texts[0], texts
    cfg.train.lora_rank = 32
    assert memory_view(ctx, cfg, lines) != texts[0] and len(made) == 2
    cfg.validation.resolution = 2048  # the validation round becomes the GPU's peak
    assert "validation images 2048x2048" in memory_view(ctx, cfg, lines) and len(made) == 3


def test_settings_show_only_where_they_apply() -> None:
    """Issue 40 item 11: the flow-matching keys (timestep sampling, logit mean, flow
    shift, guidance) showed on sd15 and the LoRA keys on a full fine-tune; each shows
    where it applies, as frames and control folders do, or while it holds a value the
    check refuses (so its error stays fixable)."""
    import gradio as gr

    from ui import tab_dataset, tab_train
    from ui.form import Form

    form = Form()
    with gr.Blocks():
        tab_dataset.build(form)
        tab_train.build(form)
    keys = form.family_keys()

    def shown(family: str, method: str, **changed: object) -> set[str]:
        values = [changed.get(c.elem_id.replace("-", "_"), c.value) for c, _ in keys]
        updates = form.visibility(family, method, values)
        return {c.elem_id for (c, _), u in zip(keys, updates, strict=False) if u["visible"]}

    flow = {"f-train-timestep_sampling", "f-train-logit_mean", "f-train-logit_std",
            "f-train-mode_scale", "f-train-flow_shift", "f-train-loss_weighting"}
    lora = {"f-train-lora_kind", "f-train-lora_rank", "f-train-lora_alpha",
            "f-train-lora_targets", "f-train-init_lora"}
    ddpm = {"f-train-noise_offset", "f-train-min_snr_gamma", "f-model-prediction_type"}
    first = {c.elem_id for c, _ in keys if c.visible is not False}  # the page's sd15 LoRA
    for view in (first, shown("sd15", "lora")):
        assert not view & (flow | {"f-train-guidance"}) and lora | ddpm <= view
    flux_full = shown("flux", "full")
    assert flow | {"f-train-guidance"} <= flux_full and not flux_full & (lora | ddpm)
    assert "f-train-guidance" not in shown("sd3", "lora"), "no guidance-distilled sd3"
    clip_lora = {"f-train-text_encoder_lora", "f-train-text_encoder_lr"}  # CLIP families
    assert clip_lora <= shown("sdxl", "lora") and not clip_lora & shown("flux", "lora")
    assert "f-train-flow_shift" in shown("sd15", "lora", f_train_flow_shift=3.0)
    assert "f-train-lora_kind" in shown("sd15", "full", f_train_lora_kind="dora")


def test_add_copies_the_first_datasets_settings_and_remove_can_be_undone(page):
    """Issue 40 item 12: Add gave resolution 512 beside a first dataset at 128 (an
    upscaling warning at once), and Remove threw a dataset's settings away at a click."""
    from ui import tab_dataset

    form, tab = page
    first = DatasetConfig(id="shapes", images="a", vae_cache="b", resolution=128,
                          crop="random", caption="tags", repeats=3, masks="m",
                          regularization=True)
    data = form_data(form, [first])
    added = tab_dataset.on_add(form, data)[form.datasets].items[1]
    assert (added.resolution, added.crop, added.caption, added.repeats) == (128, "random",
                                                                           "tags", 3)
    assert (added.id, added.images, added.vae_cache) == ("data2", "data/data2",
                                                         "cache/data2/vae")
    assert (added.masks, added.regularization) == ("", False), "not the first one's own"
    two = form_data(form, [first, added])  # the first selected
    gone = tab_dataset.on_remove(form, two, tab.removed, tab.undo_remove)
    assert [d.id for d in gone[form.datasets].items] == ["data2"]
    assert gone[tab.undo_remove]["visible"] is True
    assert gone[tab.undo_remove]["value"] == "Undo remove of 'shapes'"
    after = form_data(form, gone[form.datasets].items)
    after[tab.removed] = gone[tab.removed]
    back = tab_dataset.on_undo_remove(form, after, tab.removed, tab.undo_remove)
    assert back[form.datasets].items == [first, added] and back[form.datasets].selected == 0
    assert back[tab.undo_remove]["visible"] is False and back[tab.removed] is None


def test_each_optimizer_option_shows_for_the_optimizers_that_read_it():
    """SETTING_RULES follow the catalogue: every option key has a rule, shown for each
    optimizer whose keys name it and for no other; the schedules' own keys likewise."""
    from core.config.optimizers import OPTIMIZERS, OPTION_DEFAULTS
    from ui.form import SETTING_RULES

    for key in OPTION_DEFAULTS:
        setting, applies = SETTING_RULES[f"train.{key}"]
        assert setting == "train.optimizer"
        assert {n for n in OPTIMIZERS if applies(n)} == \
            {n for n, spec in OPTIMIZERS.items() if key in spec.keys}, key
    assert [s for s in OPTIMIZERS if SETTING_RULES["train.prodigy_d_coef"][1](s)] == \
        ["prodigy"]
    cycles, power = SETTING_RULES["train.lr_cycles"][1], SETTING_RULES["train.lr_power"][1]
    assert cycles("cosine_with_restarts") and not cycles("cosine")
    assert power("polynomial") and not power("linear")

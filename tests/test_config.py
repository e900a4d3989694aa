"""The typed config: TOML round-trip, --set overrides, unknown keys, validation messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import (
    Config,
    DatasetConfig,
    apply_overrides,
    dumps_config,
    load_config,
    loads_config,
    resolved,
    save_config,
    validate_config,
)
from core.presets import PRESETS_DIR, list_presets
from core.problems import ConfigError


def messages(problems) -> list[str]:
    return [str(p) for p in problems]


def test_every_preset_round_trips_exactly_and_is_valid():
    names = list_presets()
    assert {"demo", "sd15-lora", "sdxl-lora", "sd3-lora", "flux-lora",
            "chroma-lora", "flux2-lora", "z-image-lora", "qwen-image-lora"} <= set(names)
    for name in names:
        text = (PRESETS_DIR / f"{name}.toml").read_text(encoding="utf-8")
        cfg = loads_config(text)
        # A preset may open with comment lines (what it fits, and why); the rest is canonical.
        lines = text.splitlines(keepends=True)
        while lines and lines[0].startswith("#"):
            lines.pop(0)
        assert dumps_config(cfg) == "".join(lines), name
        assert validate_config(cfg) == [], name


def test_preset_families_match_their_names():
    for name, family in [("sd15-lora", "sd15"), ("sdxl-lora", "sdxl"), ("sd3-lora", "sd3"),
                          ("flux-lora", "flux"), ("flux2-lora", "flux2"),
                          ("chroma-lora", "chroma"), ("z-image-lora", "z_image"),
                          ("qwen-image-lora", "qwen_image"), ("demo", "sd15"),
                          ("flux-kontext-lora", "flux_kontext"),
                          ("qwen-image-edit-lora", "qwen_image_edit"),
                          ("anima-lora", "anima")]:
        assert load_config(PRESETS_DIR / f"{name}.toml").model.family == family


def test_save_then_load_keeps_every_value(tmp_path: Path):
    cfg = Config(datasets=[DatasetConfig(id="a", images="x", vae_cache="c/a"),
                           DatasetConfig(id="b", images="y", vae_cache="c/b", repeats=3)])
    cfg.validation.prompts = ['quote " and backslash \\ and ünïcode', "second"]
    cfg.train.learning_rate = 3e-5
    save_config(cfg, tmp_path / "run.toml")
    again = load_config(tmp_path / "run.toml")
    assert again == cfg


def test_partial_config_fills_defaults():
    cfg = loads_config('version = 1\n[train]\nmax_steps = 7\n')
    assert cfg.train.max_steps == 7
    assert cfg.train.batch_size == 1
    assert cfg.model.family == "sd15"


def test_the_default_model_is_tiny_sd15():
    """A contract (docs/config.md): the config's default comes from the registry (the
    first family in display order), so a new family's ORDER must not change it."""
    assert (Config().model.family, Config().model.path) == ("sd15", "tiny:sd15")


def test_unknown_keys_are_named_with_a_suggestion():
    text = 'version = 1\n[train]\nmax_step = 5\n[modle]\nfamily = "sd15"\n'
    with pytest.raises(ConfigError) as info:
        loads_config(text)
    lines = messages(info.value.problems)
    assert any("train.max_step" in m and "did you mean 'max_steps'" in m for m in lines)
    assert any(m.startswith("error: modle:") and "'model'" in m for m in lines)


def test_unknown_dataset_key_names_its_index():
    text = 'version = 1\n[[datasets]]\nid = "a"\n[[datasets]]\nid = "b"\nimage = "x"\n'
    with pytest.raises(ConfigError) as info:
        loads_config(text)
    assert any("datasets.1.image" in m and "'images'" in m for m in messages(info.value.problems))


def test_an_unknown_key_names_its_line():
    """Issue 54 item 4: a typo in a long file is found by its line (a dataset's in the
    right [[datasets]] table, a table's header, past a multi-line string holding `=`)."""
    text = ('version = 1\n[model]\nfamily = "sd15"\n\n[validation]\nprompts = """\n'
            'max_stepz = 1\n"""\n[train]\n# max_stepz = 2\nmax_stepz = 3\n'
            '[[datasets]]\nid = "a"\n[[datasets]]\nimage = "x"\n[trian]\n')
    with pytest.raises(ConfigError) as info:
        loads_config(text)
    lines = messages(info.value.problems)
    assert "error: train.max_stepz: unknown key on line 11 (did you mean 'max_steps'?)" \
        in lines, lines
    assert any(m.startswith("error: datasets.1.image: unknown key on line 15 ") for m in lines)
    assert any(m.startswith("error: trian: unknown key on line 16 ") for m in lines)


def test_wrong_types_are_named():
    with pytest.raises(ConfigError) as info:
        loads_config('version = 1\n[train]\nmax_steps = "lots"\nseed = 1.5\n')
    lines = messages(info.value.problems)
    assert any("train.max_steps" in m and "integer" in m and "lots" in m for m in lines)
    assert any("train.seed" in m for m in lines)


def test_a_toml_file_keeps_its_own_types():
    """`--set` parses text; a TOML file has types, and a quoted number there is a mistake."""
    text = ('version = 1\n[train]\nmax_steps = "20"\nmixed_precision = 1\nema = "yes"\n'
            'learning_rate = nan\n[validation]\nresolution = 64.0\nprompts = "a red circle"\n')
    with pytest.raises(ConfigError) as info:
        loads_config(text)
    named = {p.where for p in info.value.problems}
    assert named == {"train.max_steps", "train.mixed_precision", "train.ema",
                     "train.learning_rate", "validation.resolution", "validation.prompts"}
    assert loads_config("version = 1\n[train]\nlearning_rate = 1\n").train.learning_rate == 1.0


def test_bad_toml_and_bad_version_are_reported(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text("version = 1\n[train\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert str(bad) in str(info.value) and "not valid TOML" in str(info.value)
    with pytest.raises(ConfigError, match="unsupported config version 2"):
        loads_config("version = 2\n")
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")


def test_overrides_convert_types_and_index_lists():
    cfg = load_config(PRESETS_DIR / "demo.toml")
    apply_overrides(cfg, ["train.max_steps=20", "datasets.0.repeats=3",
                          "train.learning_rate=2e-4", "datasets.0.bucketing=false",
                          "validation.prompts=[\"a\", \"b\"]", "validation.prompts.1=c",
                          "model.path=org/model"])
    assert cfg.train.max_steps == 20
    assert cfg.datasets[0].repeats == 3
    assert cfg.train.learning_rate == pytest.approx(2e-4)
    assert cfg.datasets[0].bucketing is False
    assert cfg.validation.prompts == ["a", "c"]
    assert cfg.model.path == "org/model"


def test_override_can_add_a_dataset():
    cfg = load_config(PRESETS_DIR / "demo.toml")
    apply_overrides(cfg, ["datasets.1.images=more", "datasets.1.vae_cache=cache/more"])
    assert len(cfg.datasets) == 2 and cfg.datasets[1].images == "more"


@pytest.mark.parametrize("item, expected", [
    ("train.max_steps=abc", "train.max_steps: expected an integer, got 'abc'"),
    ("train.max_stepz=3", "did you mean 'max_steps'"),
    ("datasets.5.repeats=2", "index 5 out of range"),
    ("train.mixed_precision", "--set expects key=value"),
    ("datasets.0.bucketing=maybe", "expected true or false"),
    ("train=3", "is a section"),
])
def test_bad_overrides_say_what_is_wrong(item: str, expected: str):
    cfg = load_config(PRESETS_DIR / "demo.toml")
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, [item])
    assert expected in str(info.value)


def test_validation_names_key_and_bound():
    cfg = load_config(PRESETS_DIR / "demo.toml")
    apply_overrides(cfg, ["train.learning_rate=0", "train.mixed_precision=fp8",
                          "datasets.0.repeats=0", "datasets.0.crop=middle",
                          "model.path=tiny:sdxl"])
    lines = messages(validate_config(cfg))
    assert "error: train.learning_rate: must be greater than 0.0; got 0.0" in lines
    assert any(m.startswith("error: train.mixed_precision: must be one of no, fp16, bf16")
               for m in lines)
    assert "error: datasets.0.repeats: must be at least 1; got 0" in lines
    assert any(m.startswith("error: datasets.0.crop:") for m in lines)
    assert any(m.startswith("error: model.path:") and "model.family" in m for m in lines)


def test_validation_of_datasets():
    cfg = Config(datasets=[DatasetConfig(id="a", images="x", vae_cache="c1", probability=0),
                           DatasetConfig(id="a", images="", vae_cache="c2", probability=0,
                                         caption="instance_prompt")])
    lines = messages(validate_config(cfg))
    assert any("datasets.1.id" in m and "already used by datasets.0" in m for m in lines)
    assert any("datasets.1.images" in m and "is empty" in m for m in lines)
    assert any("datasets.1.instance_prompt" in m for m in lines)
    assert any("probability 0" in m for m in lines)
    assert any(m.startswith("error: datasets:") for m in
               messages(validate_config(Config())))


def test_resolved_paths_join_workspace_and_leave_hub_ids(tmp_path: Path):
    cfg = load_config(PRESETS_DIR / "sd15-lora.toml")
    cfg.datasets[0].images = "/abs/images"
    full = resolved(cfg, tmp_path)
    assert full.datasets[0].images == "/abs/images"
    assert full.datasets[0].vae_cache == str(tmp_path / "cache/sd15/mydata/vae")
    assert full.output.dir == str(tmp_path / "runs/sd15-lora")
    assert full.model.path == "stable-diffusion-v1-5/stable-diffusion-v1-5"
    assert cfg.output.dir == "runs/sd15-lora", "the original config is left as written"
    (tmp_path / "models/local").mkdir(parents=True)
    cfg.model.path = "models/local"
    assert resolved(cfg, tmp_path).model.path == str(tmp_path / "models/local")


def test_model_config_resolves_like_model_path(tmp_path: Path):
    """A single file's architecture config: a workspace folder is joined, a hub id or a
    tiny:<name> is kept, a missing relative folder is kept as written (the check names it)."""
    cfg = Config()
    (tmp_path / "models/configs").mkdir(parents=True)
    for value, expected in [("models/configs", str(tmp_path / "models/configs")),
                            ("stabilityai/stable-diffusion-2-base", None),
                            ("tiny:sd15", None), ("models/missing", None), ("", None)]:
        cfg.model.config = value
        assert resolved(cfg, tmp_path).model.config == (expected or value), value


def test_prediction_type_applies_only_to_epsilon_and_v_families():
    cfg = Config(datasets=[DatasetConfig(id="a", images="x", vae_cache="c")])
    for family in ("sd15", "sd2", "sdxl"):
        cfg.model.family, cfg.model.path = family, f"tiny:{family}"
        cfg.model.prediction_type = "v_prediction"
        assert validate_config(cfg) == [], family
    for family in ("sd3", "flux", "chroma"):
        cfg.model.family, cfg.model.path = family, f"tiny:{family}"
        cfg.model.prediction_type = "epsilon"
        [problem] = validate_config(cfg)
        assert problem.where == "model.prediction_type" and "flow matching" in problem.message
        assert '"auto"' in problem.message


def test_qwen_image_validation_needs_two_sampling_steps():
    """One step of Qwen-Image's scheduler draws NaN (its shift_terminal stretch)."""
    cfg = Config(datasets=[DatasetConfig(id="a", images="x", vae_cache="c")])
    cfg.model.family, cfg.model.path = "qwen_image", "tiny:qwen_image"
    cfg.validation.steps = 2
    assert validate_config(cfg) == []
    cfg.validation.steps = 1
    [problem] = validate_config(cfg)
    assert problem.where == "validation.steps" and "2 or more" in problem.message
    cfg.validation.prompts = []
    assert validate_config(cfg) == [], "no validation, nothing sampled"
    cfg.model.family, cfg.model.path, cfg.validation.prompts = "flux", "tiny:flux", ["a"]
    assert validate_config(cfg) == []


@pytest.mark.parametrize("family", ["sd15", "sd2", "sdxl", "sd3", "flux", "flux2", "chroma",
                                    "z_image", "qwen_image"])
def test_min_snr_gamma_where_the_loss_ignores_it_is_a_warning_naming_the_key(family: str):
    """Flow matching has no SNR to weight by: its families train as if min_snr_gamma were
    0, so a value set there is named, not passed silently."""
    cfg = Config(datasets=[DatasetConfig(id="a", images="x", vae_cache="c")])
    cfg.model.family, cfg.model.path = family, f"tiny:{family}"
    cfg.train.min_snr_gamma = 5.0
    problems = validate_config(cfg)
    if family in ("sd15", "sd2", "sdxl"):  # epsilon and v: their loss weights by it
        assert problems == []
        return
    [problem] = problems
    assert (problem.level, problem.where) == ("warning", "train.min_snr_gamma")
    assert "flow matching" in problem.message and "set it to 0" in problem.message


def test_text_encoder_lr_without_the_text_encoder_lora_is_a_warning_naming_the_key():
    cfg = Config(datasets=[DatasetConfig(id="a", images="x", vae_cache="c")])
    cfg.train.text_encoder_lr = 1e-5
    [problem] = validate_config(cfg)
    assert (problem.level, problem.where) == ("warning", "train.text_encoder_lr")
    assert "train.text_encoder_lora" in problem.message
    cfg.train.text_encoder_lora = True  # now a text encoder trains at that rate
    assert validate_config(cfg) == []


def test_noise_offset_applies_only_to_epsilon_and_v_families():
    cfg = Config(datasets=[DatasetConfig(id="a", images="x", vae_cache="c")])
    cfg.train.noise_offset = 0.1
    assert validate_config(cfg) == []
    cfg.model.family, cfg.model.path = "flux", "tiny:flux"
    [problem] = validate_config(cfg)
    assert problem.where == "train.noise_offset" and "flow matching" in problem.message

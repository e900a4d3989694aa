"""A family's own keys (its options.py) are merged into the schema: Wan 2.2's
model.experts lives in families/wan/options.py, is read, set and saved as any key for
wan, left out of another family's saved config, refused naming wan when set on another
family, and shown by the form for wan only. Pure config work: fast."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from core.config import Config, apply_override, dumps_config, loads_config
from core.config.checks import validate_config
from core.config.family_options import owner, with_family_options
from core.config.schema import ModelConfig, SharedModelConfig
from core.fields import _f


def experts_field() -> dataclasses.Field:
    return next(f for f in dataclasses.fields(ModelConfig) if f.name == "experts")


def test_wans_experts_key_is_declared_in_its_folder_and_merged_into_model() -> None:
    assert "experts" not in {f.name for f in dataclasses.fields(SharedModelConfig)}
    assert owner(experts_field()) == "wan"
    assert experts_field().metadata["choices"] == ("both", "high_noise", "low_noise")


def test_it_is_set_saved_and_loaded_for_wan_and_left_out_for_another_family() -> None:
    cfg = Config()
    apply_override(cfg, "model.family=wan")
    apply_override(cfg, "model.experts=low_noise")
    text = dumps_config(cfg)
    assert 'experts = "low_noise"' in text
    assert loads_config(text).model.experts == "low_noise"
    assert "experts" not in dumps_config(Config())  # sd15's saved config
    apply_override(cfg, "model.experts=middle")  # its choices are checked as any key's
    assert any(p.where == "model.experts" and p.message.startswith("must be one of both")
               for p in validate_config(cfg))


def test_set_on_another_family_the_check_names_the_key_and_its_family() -> None:
    cfg = Config()
    cfg.model.experts = "high_noise"
    refused = [p for p in validate_config(cfg) if p.where == "model.experts"]
    assert len(refused) == 1 and refused[0].level == "error"
    assert "a wan key" in refused[0].message and "'sd15'" in refused[0].message
    cfg.model.family, cfg.model.path = "wan", "tiny:wan22"  # two experts
    assert not [p for p in validate_config(cfg) if p.where == "model.experts"]


def test_the_form_shows_it_for_wan_only() -> None:
    from ui.form import family_tags, shown_for
    from ui.state import section_specs

    spec = next(s for s in section_specs("model") if s.name == "experts")
    tags = family_tags(spec)
    assert shown_for(tags, "wan") and not shown_for(tags, "sd15")
    assert not shown_for(tags, "flux")


def test_a_key_declared_twice_is_refused_naming_both_places() -> None:
    @dataclass
    class Clashing:
        experts: str = _f("x", label="Clash")

    with pytest.raises(TypeError, match="model.experts: declared by wan's options.py and by "
                                        "the shared schema"):
        with_family_options("model", Clashing, "ModelConfig")


def test_the_audio_key_is_shown_and_saved_for_a_family_with_sound_only() -> None:
    """datasets.N.audio applies where the family has an audio spec (ltx2), not to
    every video family: the form hides it for Wan and a saved Wan config leaves it out;
    validation.control_images shows for edit and video families (a first image)."""
    from core.config import Config, DatasetConfig
    from core.config.files import dumps_config
    from ui.form import family_tags, shown_for
    from ui.state import dataset_specs, section_specs

    audio = family_tags(next(s for s in dataset_specs() if s.name == "audio"))
    assert shown_for(audio, "ltx2") and not shown_for(audio, "wan")
    assert not shown_for(audio, "sd15")
    images = family_tags(next(s for s in section_specs("validation")
                              if s.name == "control_images"))
    assert all(shown_for(images, f) for f in ("wan", "flux_kontext", "ltx2"))
    assert not shown_for(images, "sdxl")
    cfg = Config()
    cfg.datasets.append(DatasetConfig(id="clips", images="clips"))
    for family, saved in (("ltx2", True), ("wan", False)):
        cfg.model.family = family
        assert ('audio = "auto"' in dumps_config(cfg)) is saved, family

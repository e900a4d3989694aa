"""A validation prompt's own settings (kohya's flags, core/config/prompts.py) and the
check's words about them and the negative prompt: pure functions, no model."""

from __future__ import annotations

from core.config import Config, ValidationConfig, validate_config
from core.config.prompts import prompt_settings, split_flags


def test_flags_split_from_the_text_and_override_the_section():
    assert split_flags("a cat --n blurry, dark --w 768") == \
        ("a cat", {"n": "blurry, dark", "w": "768"})
    assert split_flags("a well--known cat") == ("a well--known cat", {})
    cfg = ValidationConfig(prompts=["a", "b --d 9 --h 256 --l 2 --s 3"], seed=4,
                           resolution=128, width=192, negative_prompt="ugly")
    first, second = prompt_settings(cfg, 0), prompt_settings(cfg, 1)
    assert (first.seed, first.width, first.height, first.negative) == (4, 192, 128, "ugly")
    assert (second.text, second.seed, second.width, second.height) == ("b", 9, 192, 256)
    assert (second.guidance_scale, second.steps) == (2.0, 3)


def _said(family: str = "sd15", **validation) -> list[str]:
    cfg = Config()
    cfg.model.family, cfg.model.path = family, f"tiny:{family}"
    for key, value in validation.items():
        setattr(cfg.validation, key, value)
    return [f"{p.level} {p.where}: {p.message}" for p in validate_config(cfg)
            if p.where.startswith("validation.")]


def test_the_check_names_a_bad_flag_and_size_by_prompt_and_key():
    said = _said(prompts=["a cat --w 100 --x 1", "--d 3"], height=50)
    assert any("validation.prompts: prompt 1 ('a cat'): --w (width) must be a multiple of 16"
               in s for s in said), said
    assert any("--x is not a flag" in s for s in said)
    assert any("prompt 2 ('') has no text" in s for s in said)
    assert any(s.startswith("error validation.height") for s in said)
    assert _said(prompts=["a cat --w 96 --n dark"]) == []


def test_a_negative_prompt_the_run_would_ignore_is_a_warning_naming_the_key():
    assert _said(negative_prompt="blurry") == []  # sd15 at guidance 5 uses it
    assert any("guidance_scale = 1 turns classifier-free guidance off" in s
               for s in _said(negative_prompt="blurry", guidance_scale=1.0))
    flux = _said("flux", negative_prompt="blurry")
    assert any(s.startswith("warning validation.negative_prompt") and "guidance-distilled"
               in s for s in flux), flux
    flagged = _said("flux", prompts=["a", "b --n dark"])
    assert any("validation.prompts: is set (--n of prompt 2)" in s for s in flagged), flagged

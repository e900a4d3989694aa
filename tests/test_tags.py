"""Tag shuffling and caption dropout choices (pure functions) and their config checks."""

from __future__ import annotations

import random

from core.config import Config, DatasetConfig
from core.data.tags import sample_caption, sample_rng, shuffle_tags


def test_shuffle_tags_keeps_the_first_tags_and_shuffles_the_rest():
    caption = "sks dog, red collar, grass, sunny, park, running, ball"
    seen = set()
    for seed in range(20):
        out = shuffle_tags(caption, 2, random.Random(seed)).split(", ")
        assert out[:2] == ["sks dog", "red collar"]
        assert sorted(out) == sorted(caption.split(", "))
        seen.add(tuple(out))
    assert len(seen) > 5, "the other tags change order"
    assert shuffle_tags(" a ,b,, c ", 5, random.Random(0)) == "a, b, c"


def test_choices_are_a_function_of_seed_step_and_slot():
    first = [sample_caption("a, b, c, d, e", sample_rng(7, 3, s), 0.5, True, 1)
             for s in range(16)]
    again = [sample_caption("a, b, c, d, e", sample_rng(7, 3, s), 0.5, True, 1)
             for s in range(16)]
    assert first == again  # a resume replays the same choices
    assert "" in first and any(c for c in first), "about half drop at 0.5"
    assert all(c.startswith("a, ") for c in first if c)
    assert {sample_caption("x", sample_rng(0, s, 0), 1.0, False, 0) for s in range(9)} == {""}
    assert {sample_caption("x", sample_rng(0, s, 0), 0.0, False, 0) for s in range(9)} == {"x"}


def _cfg(family: str, **train) -> Config:
    cfg = Config()
    cfg.model.family, cfg.model.path = family, f"tiny:{family}"
    cfg.datasets.append(DatasetConfig(id="d", images="data", vae_cache="cache/vae"))
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def test_text_encoder_lora_on_flux_is_a_config_error_naming_the_key():
    from core.config import validate_config

    problems = [p for p in validate_config(_cfg("flux", text_encoder_lora=True))
                if p.level == "error"]
    assert [p.where for p in problems] == ["train.text_encoder_lora"]
    assert "not supported for flux" in problems[0].message
    assert not [p for p in validate_config(_cfg("sdxl", text_encoder_lora=True))
                if p.level == "error"]


def test_check_says_which_captions_skip_the_text_cache(tmp_path):
    from conftest import write_shapes

    from core.check import run_check

    write_shapes(tmp_path / "data", 2)
    cfg = _cfg("sd15", caption_dropout=0.1)
    cfg.datasets[0].shuffle_tags = True
    lines = run_check(cfg, tmp_path, estimate=False).lines()
    assert any(line.startswith("note: datasets.0.shuffle_tags: dataset 'd'") and
               "encoded at train time" in line for line in lines), lines
    cfg.train.text_encoder_lora = True
    lines = run_check(cfg, tmp_path, estimate=False).lines()
    assert any("train.text_encoder_lora" in line and "text cache is not used" in line
               for line in lines), lines


def test_the_plan_caches_the_empty_caption_once_and_skips_shuffled_captions(tmp_path):
    from conftest import small_config

    from core.cache.plan import plan_caches

    cfg = small_config(tmp_path, datasets=2, images=2)
    cfg.train.caption_dropout = 0.2
    cfg.datasets[1].shuffle_tags = True
    plan = plan_caches(cfg, {"family": "sd15", "model": "x"})
    assert sorted(job.caption for job in plan.text_jobs) == [
        "", "dataset 0 image 0", "dataset 0 image 1"]
    assert plan.datasets[1].text_at_train_time and not plan.datasets[1].text_entries

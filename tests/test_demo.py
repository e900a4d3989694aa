"""The demo as shipped (`--preset demo`): its trained tiny base, its autoencoder that
gives back the shapes' colours, and a run that learns the captions and shows before
beside after."""

from __future__ import annotations

import colorsys
import json
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO
from PIL import Image

from core.config import load_config
from core.presets import preset_path

# The hue (degrees) of each demo colour (core/data/synthetic.py COLORS).
HUES = {"red": 0.0, "green": 130.0, "blue": 225.0, "yellow": 50.0}


def hue_share(image: Image.Image, colour: str, tolerance: float = 35.0) -> float:
    """Of the strongly coloured pixels (saturated and not dark), the share whose hue is
    within `tolerance` degrees of `colour`'s; 0 when no pixel is strongly coloured."""
    import numpy as np

    strong = hits = 0
    for r, g, b in np.asarray(image.convert("RGB"), dtype=np.int64).reshape(-1, 3):
        h, s, v = colorsys.rgb_to_hsv(r / 255, g / 255, b / 255)
        if s < 0.45 or v < 0.35:
            continue
        strong += 1
        distance = abs(h * 360 - HUES[colour])
        hits += min(distance, 360 - distance) <= tolerance
    return hits / strong if strong else 0.0


def test_hue_share_tells_the_demo_colours_apart():
    import random

    from core.data.synthetic import BACKGROUNDS, COLORS, draw_shape

    for name, rgb in COLORS.items():
        image = draw_shape("triangle", rgb, BACKGROUNDS["white"], 64, random.Random(0))
        assert hue_share(image, name) == 1.0
        assert all(hue_share(image, other) == 0.0 for other in COLORS if other != name)


def test_the_bases_tokenizer_has_the_demo_words_and_still_spells_anything(tmp_path: Path):
    """The demo base reads "green" as one token (a 3-layer encoder confused the spelled
    out colours); other tiny models keep the letter-only vocabulary."""
    from core.models.families.sd15.shapes import WORDS
    from core.models.tiny.clip import clip_tokenizer, tiny_clip_config

    words = clip_tokenizer(tmp_path / "words", words=WORDS)
    assert words.tokenize("a green triangle on a black background") == [
        "a</w>", "green</w>", "triangle</w>", "on</w>", "a</w>", "black</w>",
        "background</w>"]
    assert "".join(words.tokenize("greenish Bluebirds")).replace("</w>", " ").split() == [
        "greenish", "bluebirds"], "unknown words still spell out"
    assert len(words) == tiny_clip_config(words=WORDS).vocab_size
    plain = clip_tokenizer(tmp_path / "plain")
    assert plain.tokenize("a red") == ["a</w>", "r", "e", "d</w>"]
    assert len(plain) == tiny_clip_config().vocab_size == 514


def test_tiny_names_include_the_trained_base_of_its_family():
    from core.config import Config, validate_config
    from core.models.loading import check_model_source
    from core.models.tiny import tiny_family, tiny_names

    assert tiny_family("sd15-shapes") == "sd15" and "sd15-shapes" in tiny_names()
    assert check_model_source("tiny:sd15-shapes", "sd15") == []
    (wrong,) = check_model_source("tiny:sd15-shapes", "sdxl")
    assert "sd15" in wrong.message and "tiny:sdxl" in wrong.message
    cfg = Config()
    cfg.model.path = "tiny:sd15-shape"
    assert any("tiny:sd15-shapes" in p.message for p in validate_config(cfg)
               if p.where == "model.path"), "a typo lists the names there are"


def test_shapes_autoencoder_gives_back_the_shape_and_its_colour(tmp_path: Path):
    """Encode and decode each demo colour's triangle: the decoded image has the same
    colour where the shape was, and the background stays background."""
    import random

    import numpy as np
    import torch
    from diffusers import AutoencoderKL

    from core.data.synthetic import BACKGROUNDS, COLORS, draw_shape
    from core.models.families.sd15.shapes.pretrain import to_pixels
    from core.models.tiny import build_tiny_folder

    build_tiny_folder("sd15-shapes", tmp_path)
    vae = AutoencoderKL.from_pretrained(str(tmp_path / "vae"), local_files_only=True)
    for name, rgb in COLORS.items():
        image = draw_shape("triangle", rgb, BACKGROUNDS["white"], 128, random.Random(1))
        with torch.no_grad():
            decoded = vae.decode(vae.encode(to_pixels([image])).latent_dist.mean).sample
        array = ((decoded[0].clamp(-1, 1) + 1) * 127.5).permute(1, 2, 0).byte().numpy()
        out = Image.fromarray(array)
        assert hue_share(out, name) > 0.75, name
        error = np.abs(array.astype(float) - np.asarray(image, dtype=float)).mean()
        assert error < 12, f"{name}: mean error {error:.1f} of 255"


def test_demo_preset_trains_the_shapes_base_and_validates_before_training():
    cfg = load_config(preset_path("demo"))
    assert cfg.model.path == "tiny:sd15-shapes" and cfg.validation.before_training
    assert cfg.train.max_steps <= 400
    assert all(p.split()[-1] == "triangle" for p in cfg.validation.prompts), \
        "the prompts show the concept the base lacks"


def events(run_dir: Path) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
@pytest.mark.timeout(1600)  # the whole demo run: its own 1500 s limit, not the suite's 600
def test_demo_learns_the_captions_and_shows_before_beside_after(tmp_path: Path):
    """The demo as shipped: the eval loss falls, the loss with true captions is well
    below the loss with shuffled ones, the prompts are drawn before training and after,
    and the summary points at the before/after grid."""
    done = subprocess.run([PYTHON, "app.py", "--no-ui", "--workspace", str(tmp_path),
                           "--preset", "demo"], cwd=REPO, capture_output=True, text=True,
                          timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "runs/demo"
    evals = [e for e in events(run_dir) if e["type"] == "eval"]
    first, last = evals[0], evals[-1]
    # v-prediction at zero terminal SNR: the loss is dominated by the noisiest steps,
    # where v is the image itself and no LoRA helps much, so it falls by about a tenth.
    assert last["loss"] < 0.95 * first["loss"], "the LoRA lowers the eval loss"
    gap = last["loss_shuffled"] / last["loss"] - 1
    assert gap >= 0.10, f"true captions only {gap:.1%} better than shuffled ones"
    rounds = [e for e in events(run_dir) if e["type"] == "validation"]
    assert [e["step"] for e in rounds] == [0, 200, 400]
    prompts = load_config(run_dir / "config.toml").validation.prompts
    for prompt, image in zip(prompts, rounds[-1]["images"], strict=True):
        colour = prompt.split()[1]  # "a <colour> <shape>"
        share = hue_share(Image.open(image), colour)
        assert share > 0.5, f"{image} for {prompt!r}: only {share:.0%} of its colour"
    grid = run_dir / "validation/grid.png"
    assert grid.is_file() and f"before/after grid: {grid}" in done.stdout

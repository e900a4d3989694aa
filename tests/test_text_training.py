"""Caption dropout, tag shuffling and the text-encoder LoRA in real (tiny) training runs.

The trainer runs in this process (accelerate's state reset around each run, as in
tests/test_train_dtypes.py) to keep the runs fast; tests/test_train.py covers
`accelerate launch` itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import small_config, write_shapes

from core.config import Config, save_config
from tests.conftest import train_in_process

pytestmark = pytest.mark.slow


def _train(cfg: Config, workspace: Path, *extra: str) -> dict[int, float]:
    """Run the trainer; returns its step losses."""
    config = Path(cfg.output.dir).parent / f"{Path(cfg.output.dir).name}.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    save_config(cfg, config)
    assert train_in_process(config, workspace, *extra) == 0
    lines = (Path(cfg.output.dir) / "events.jsonl").read_text().splitlines()
    return {e["step"]: e["loss"] for e in map(json.loads, lines) if e["type"] == "step"}


def _quick(cfg: Config, steps: int = 3) -> Config:
    cfg.train.max_steps, cfg.train.checkpoint_every = steps, 1000
    cfg.train.eval_every, cfg.train.eval_images = 1000, 2
    cfg.validation.every, cfg.validation.prompts = 1000, []
    cfg.launch.cpu = True
    return cfg


def test_caption_dropout_one_trains_as_empty_captions(tmp_path: Path, tiny_workspace: Path):
    dropped = _quick(small_config(tmp_path / "a", images=4))
    dropped.train.caption_dropout = 1.0
    empty = _quick(small_config(tmp_path / "b", images=4))
    write_shapes(Path(empty.datasets[0].images), 4, captions=[""])
    # Without dropout the first run trains on "dataset 0 image i", whose text changes
    # the tiny UNet's loss, so the losses would differ.
    losses = _train(dropped, tiny_workspace)
    assert len(losses) == 3
    assert losses == pytest.approx(_train(empty, tiny_workspace), rel=1e-6, abs=1e-7)


def test_shuffled_tags_are_encoded_at_train_time(tmp_path: Path, tiny_workspace: Path,
                                                 monkeypatch: pytest.MonkeyPatch):
    from core.models.stable_diffusion import StableDiffusionFamily

    seen: list[str] = []
    original = StableDiffusionFamily.encode_prompts

    def recording(self, c, prompts, grad=False):
        seen.extend(prompts)
        return original(self, c, prompts, grad)

    monkeypatch.setattr(StableDiffusionFamily, "encode_prompts", recording)
    cfg = _quick(small_config(tmp_path, images=2), steps=6)
    write_shapes(Path(cfg.datasets[0].images), 2,
                 captions=["sks, red, round, small, shiny, flat"])
    cfg.datasets[0].shuffle_tags, cfg.datasets[0].keep_tokens = True, 1
    cfg.train.caption_dropout = 0.3
    _train(cfg, tiny_workspace)
    tagged = [p for p in seen if p.startswith("sks, ")]
    assert len(tagged) >= 8  # 6 steps x 2 samples, some dropped, plus the eval set's
    assert all(sorted(p.split(", ")) == sorted("sks, red, round, small, shiny, flat".split(", "))
               for p in tagged)
    assert len(set(tagged)) > 3, "the order changes from sample to sample"
    assert "" in seen, "dropped samples encode the empty caption"
    text_cache = Path(cfg.text_cache.dir)
    assert not text_cache.exists() or not list(text_cache.rglob("*.safetensors")), \
        "no shuffled caption (and no empty one: this dataset encodes it itself) is cached"


def _encoder_outputs(pipe, prompt: str = "a red circle") -> list:
    import torch

    out = []
    for tokenizer, encoder in ((pipe.tokenizer, pipe.text_encoder),
                               (getattr(pipe, "tokenizer_2", None),
                                getattr(pipe, "text_encoder_2", None))):
        if encoder is not None:
            ids = tokenizer([prompt], padding="max_length", return_tensors="pt").input_ids
            with torch.no_grad():
                out.append(encoder(ids, output_hidden_states=True).hidden_states[-2])
    return out


def _kohya_prefixes(path: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        return {key.split("_text_model")[0] for key in fh.keys() if key.startswith("lora_te")}


def _te_lora_config(tmp: Path, family: str, steps: int) -> Config:
    cfg = _quick(small_config(tmp, images=4, family=family), steps=steps)
    cfg.train.text_encoder_lora = True
    cfg.train.text_encoder_lr = 1e-2  # big enough to move the encoders in a few steps
    cfg.train.eval_every = steps
    cfg.validation.every, cfg.validation.prompts = steps, ["a red circle"]
    return cfg


@pytest.mark.parametrize(("family", "prefixes"), [("sd15", {"lora_te"}),
                                                  ("sdxl", {"lora_te1", "lora_te2"})])
def test_text_encoder_lora_is_saved_for_diffusers_and_kohya(
        tmp_path: Path, tiny_workspace: Path, family: str, prefixes: set[str]):
    from diffusers import DiffusionPipeline

    from core.models.tiny import resolve_model_path

    cfg = _te_lora_config(tmp_path, family, steps=2)
    _train(cfg, tiny_workspace)
    lora = Path(cfg.output.dir) / "lora"
    assert _kohya_prefixes(lora / "lora_kohya.safetensors") == prefixes
    pipe = DiffusionPipeline.from_pretrained(resolve_model_path(f"tiny:{family}",
                                                                tiny_workspace))
    before = _encoder_outputs(pipe)
    pipe.load_lora_weights(str(lora))  # a UNet-only LoRA leaves the encoders as they were
    after = _encoder_outputs(pipe)
    assert len(after) == len(prefixes)
    for old, new in zip(before, after, strict=True):
        assert (old - new).abs().max() > 1e-4


def test_text_encoder_lora_resumes_the_same_curve(tmp_path: Path, tiny_workspace: Path):
    from safetensors import safe_open

    cfg = _te_lora_config(tmp_path, "sd15", steps=4)
    cfg.train.checkpoint_every = 2
    reference = _train(cfg, tiny_workspace)
    with safe_open(str(Path(cfg.output.dir) / "checkpoints/step_000002/trainable.safetensors"),
                   "pt") as fh:
        assert any(key.startswith("text_encoders.0.") for key in fh.keys())
    resumed = _train(cfg, tiny_workspace, "--resume", "2")
    assert [resumed[s] for s in (3, 4)] == pytest.approx([reference[s] for s in (3, 4)],
                                                          rel=1e-5, abs=1e-7)
    images = sorted((Path(cfg.output.dir) / "validation").glob("step_*/00.png"))
    assert [p.parent.name for p in images] == ["step_000004"]


def test_two_process_run_with_text_encoder_lora_and_shuffled_tags(tmp_path: Path,
                                                                 tiny_workspace: Path):
    """DDP over both SDXL encoders (the first one's last layer gets no gradient) and the
    denoiser, with grad_accum, per-process tag shuffling and caption dropout."""
    from core.runs.command import build_accelerate_command
    from core.runs.manager import start_run
    from core.runs.prepare import prepare_run_dir

    cfg = _te_lora_config(tmp_path, "sdxl", steps=2)
    cfg.launch.num_processes, cfg.train.grad_accum = 2, 2
    cfg.train.batch_size, cfg.train.caption_dropout = 1, 0.5
    cfg.datasets[0].shuffle_tags = True
    run_dir = Path(cfg.output.dir)
    prepare_run_dir(cfg, run_dir, resume=False)
    handle = start_run(build_accelerate_command(cfg, run_dir, tiny_workspace,
                                                resume=None), run_dir)
    assert handle.wait(timeout=600) == "done", (run_dir / "train.log").read_text()[-3000:]
    assert _kohya_prefixes(run_dir / "lora/lora_kohya.safetensors") == {"lora_te1", "lora_te2"}

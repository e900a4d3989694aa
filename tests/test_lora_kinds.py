"""train.lora_kind (lora, dora, lokr, loha): the saved kohya/LyCORIS and ComfyUI files
rebuild, the way ComfyUI rebuilds them, exactly the weights peft trained; DoRA reloads in
diffusers; every kind trains, saves and resumes in the real trainer (tiny models, CPU).

`comfy_weight` below follows ComfyUI's comfy/weight_adapter/{lora,loha,lokr}.py and
base.py `weight_decompose` (read, rewritten for one module at strength 1).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import small_config, train_in_process

from core.config import Config, save_config, validate_config
from core.models.adapters import adapter_config, diffusers_kinds
from core.models.registry import get_family
from core.models.tiny import resolve_model_path

KINDS = ["lora", "dora", "lokr", "loha"]
TRANSFORMERS = ["flux", "chroma", "z_image", "qwen_image", "flux2"]
FILES = {"sd15": "lora_kohya.safetensors",
         **{family: "lora_comfyui.safetensors" for family in TRANSFORMERS}}
# The suffixes each kind's modules carry in the saved file (LoKr: w2 full or factorised).
SUFFIXES = {
    "lora": [{"lora_down.weight", "lora_up.weight", "alpha"}],
    "dora": [{"lora_down.weight", "lora_up.weight", "dora_scale", "alpha"}],
    "lokr": [{"lokr_w1", "lokr_w2", "alpha"}, {"lokr_w1", "lokr_w2_a", "lokr_w2_b", "alpha"}],
    "loha": [{"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "alpha"}],
}


def _suffixes(kind: str, family: str) -> list[set[str]]:
    """SUFFIXES, with the diffusers-style lora_A/lora_B of the ComfyUI file (not sd15)."""
    names = dict(zip(("lora_down.weight", "lora_up.weight"), _lora_names(family), strict=True))
    return [{names.get(s, s) for s in option} for option in SUFFIXES[kind]]


def _file_name(family: str, module: str) -> str:
    if family != "sd15":
        return f"transformer.{module}"
    return "lora_unet_" + module.replace(".", "_")


def _lora_names(family: str) -> tuple[str, str]:
    return ("lora_down.weight", "lora_up.weight") if family == "sd15" else \
        ("lora_A.weight", "lora_B.weight")


def comfy_weight(weight: torch.Tensor, t: dict[str, torch.Tensor], family: str) -> torch.Tensor:
    """The weight ComfyUI patches in for one module's tensors `t` (strength 1)."""
    w = weight.detach().float().clone()
    alpha = float(t["alpha"]) if "alpha" in t else None
    down_name, up_name = _lora_names(family)
    if up_name in t:  # LoRA / DoRA: mm(up, down), alpha / rank
        down, up = t[down_name].float(), t[up_name].float()
        scale = alpha / down.shape[0] if alpha is not None else 1.0
        diff = (up.flatten(1) @ down.flatten(1)).reshape(w.shape)
    elif "hada_w1_a" in t:  # LoHa: (w1a @ w1b) * (w2a @ w2b), alpha / w1b rows
        scale = alpha / t["hada_w1_b"].shape[0] if alpha is not None else 1.0
        diff = ((t["hada_w1_a"] @ t["hada_w1_b"]) * (t["hada_w2_a"] @ t["hada_w2_b"]))
        diff = diff.float().reshape(w.shape)
    else:  # LoKr: kron(w1, w2); alpha / rank only when a factor is decomposed
        dim = None
        w1 = t.get("lokr_w1")
        if w1 is None:
            dim, w1 = t["lokr_w1_b"].shape[0], t["lokr_w1_a"] @ t["lokr_w1_b"]
        w2 = t.get("lokr_w2")
        if w2 is None:
            dim, w2 = t["lokr_w2_b"].shape[0], t["lokr_w2_a"] @ t["lokr_w2_b"]
        if w2.dim() == 4:
            w1 = w1.unsqueeze(2).unsqueeze(2)
        scale = alpha / dim if alpha is not None and dim is not None else 1.0
        diff = torch.kron(w1.float(), w2.float()).reshape(w.shape)
    if "dora_scale" not in t:
        return w + scale * diff
    dora = t["dora_scale"].float()
    calc = w + scale * diff
    if dora.shape[0] == calc.shape[0]:  # output axis: ComfyUI takes the base weight's norm
        norm = w.reshape(w.shape[0], -1).norm(dim=1).reshape(w.shape[0], *[1] * (w.dim() - 1))
    else:
        norm = (calc.transpose(0, 1).reshape(calc.shape[1], -1).norm(dim=1, keepdim=True)
                .reshape(calc.shape[1], *[1] * (calc.dim() - 1)).transpose(0, 1))
    return calc * (dora / (norm + torch.finfo(torch.float32).eps))


def _adapted(family: str, kind: str, workspace: Path) -> tuple[object, object]:
    """The tiny model with a `kind` adapter (rank 4, alpha 8: the scale must survive) on
    every target ("all": convolutions too), its weights made non-trivial."""
    fam = get_family(family)
    c = fam.load(resolve_model_path(f"tiny:{family}", workspace))
    c.denoiser.add_adapter(adapter_config(kind, 4, 8.0, fam.lora_target_modules("all")))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in c.denoiser.named_parameters():
            if "magnitude" in name:
                p.mul_(torch.rand(p.shape, generator=g) * 0.4 + 0.8)
            elif p.requires_grad:
                p.normal_(0, 0.2, generator=g)
    return fam, c


def _read(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def _merged_weights(model: object) -> dict[str, torch.Tensor]:
    """{adapted module: its weight with the adapter merged}, as peft applies it."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    out = {}
    for name, layer in model.named_modules():
        if isinstance(layer, BaseTunerLayer):
            merged = copy.deepcopy(layer)
            merged.merge(adapter_names=merged.active_adapters)
            out[name] = merged.get_base_layer().weight.detach().float()
    return out


# flux2's plain LoRA is written in BFL's fused layout: tests/test_family_flux2.py checks it.
REBUILDS = [(f, k) for f in ["sd15", *TRANSFORMERS] for k in KINDS if (f, k) != ("flux2", "lora")]


@pytest.mark.parametrize("family,kind", REBUILDS)
def test_saved_file_rebuilds_the_weights_peft_applies(family: str, kind: str, tmp_path: Path,
                                                      tiny_workspace: Path):
    fam, c = _adapted(family, kind, tiny_workspace)
    files = fam.save_lora(c, tmp_path)
    loads = kind in diffusers_kinds(family)  # lora, dora; lokr for z_image and flux2
    assert ("diffusers" in files) == loads
    assert (tmp_path / "pytorch_lora_weights.safetensors").exists() == loads
    assert files["comfyui" if family != "sd15" else "kohya"] == tmp_path / FILES[family]
    saved = _read(tmp_path / FILES[family])

    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = {n: m for n, m in c.denoiser.named_modules() if isinstance(m, BaseTunerLayer)}
    assert layers
    expected = _merged_weights(c.denoiser)
    seen_suffixes = set()
    for name, layer in layers.items():
        prefix = _file_name(family, name) + "."
        tensors = {k[len(prefix):]: v for k, v in saved.items() if k.startswith(prefix)}
        suffixes = set(tensors)
        assert suffixes in _suffixes(kind, family), (name, suffixes)
        seen_suffixes.add(frozenset(suffixes))
        base = layer.get_base_layer().weight.detach().clone()
        got = comfy_weight(base, tensors, family)
        assert (expected[name] - base).abs().max() > 1e-3, name  # the adapter changes it
        assert torch.allclose(got, expected[name], rtol=1e-4, atol=1e-5), name
    # Every file key belongs to an adapted module.
    prefixes = {_file_name(family, n) + "." for n in layers}
    assert all(any(k.startswith(p) for p in prefixes) for k in saved)
    if kind == "lokr" and family == "sd15":  # both LoKr forms (and alpha rules) were checked
        assert len(seen_suffixes) == 2
    if loads and family != "sd15":  # the diffusers file reloads to the same weights
        fresh = fam.load(resolve_model_path(f"tiny:{family}", tiny_workspace))
        fam.validation_pipeline(fresh).load_lora_weights(str(tmp_path))
        reloaded = _merged_weights(fresh.denoiser)
        assert set(reloaded) == set(expected)
        for name, weight in expected.items():
            assert torch.allclose(reloaded[name], weight, rtol=1e-4, atol=1e-5), name


def _image(pipe: object) -> torch.Tensor:
    out = pipe("a red circle", num_inference_steps=1, height=64, width=64, output_type="np",
               generator=torch.Generator().manual_seed(0))
    return torch.from_numpy(out.images[0])


def test_dora_reloads_in_diffusers_and_changes_the_image(tmp_path: Path, tiny_workspace: Path):
    fam, c = _adapted("sd15", "dora", tiny_workspace)  # convolutions included
    trained = _image(fam.validation_pipeline(c))
    fam.save_lora(c, tmp_path)
    fresh = fam.load(resolve_model_path("tiny:sd15", tiny_workspace))
    pipe = fam.validation_pipeline(fresh)
    base = _image(pipe)
    pipe.load_lora_weights(str(tmp_path))
    assert (base - trained).abs().max() > 1e-2
    assert torch.allclose(_image(pipe), trained, atol=1e-4)


def test_check_refuses_kinds_it_cannot_train():
    cfg = Config()
    cfg.train.lora_kind = "lokr"
    cfg.train.method = "full"
    refused = [str(p) for p in validate_config(cfg) if p.where == "train.lora_kind"]
    assert len(refused) == 1 and "train.method" in refused[0]
    cfg.train.method, cfg.model.quantize = "lora", "int8"
    refused = [str(p) for p in validate_config(cfg) if p.where == "train.lora_kind"]
    assert len(refused) == 1 and "model.quantize" in refused[0]
    cfg.train.lora_kind = "lycoris"
    assert any(p.where == "train.lora_kind" and "lora, dora, lokr, loha" in str(p)
               for p in validate_config(cfg))
    cfg.train.lora_kind = "lora"  # plain LoRA on a quantized base stays allowed
    assert not [p for p in validate_config(cfg) if p.where == "train.lora_kind"]


def _train(cfg: Config, workspace: Path, *extra: str) -> dict[int, float]:
    config = Path(cfg.output.dir).parent / f"{Path(cfg.output.dir).name}.toml"
    save_config(cfg, config)
    assert train_in_process(config, workspace, *extra) == 0
    lines = (Path(cfg.output.dir) / "events.jsonl").read_text().splitlines()
    return {e["step"]: e["loss"] for e in map(json.loads, lines) if e["type"] == "step"}


def _run_config(tmp_path: Path, family: str, kind: str, steps: int) -> Config:
    cfg = small_config(tmp_path, images=4, family=family)
    cfg.train.lora_kind, cfg.train.lora_rank = kind, 4
    cfg.train.max_steps, cfg.train.checkpoint_every = steps, 1000
    cfg.train.eval_every, cfg.train.eval_images = 1000, 2
    cfg.validation.every, cfg.validation.prompts = 1000, []
    cfg.launch.cpu = True
    return cfg


# Each kind on a UNet and on a transformer; one new family (z_image: LoKr with its diffusers
# file). The other families' files come from the same writers (the rebuild test above).
END_TO_END = [(f, k) for f in ("sd15", "flux") for k in ("dora", "lokr", "loha")]
END_TO_END.append(("z_image", "lokr"))


@pytest.mark.slow
@pytest.mark.parametrize("family,kind", END_TO_END)
def test_each_kind_trains_and_saves_end_to_end(family: str, kind: str, tmp_path: Path,
                                               tiny_workspace: Path, capsys):
    cfg = _run_config(tmp_path, family, kind, steps=2)
    cfg.train.checkpoint_every = 1  # an intermediate save (lora/step_000001/) too
    losses = _train(cfg, tiny_workspace)
    assert sorted(losses) == [1, 2] and all(v == v for v in losses.values())
    run = Path(cfg.output.dir)
    for folder in (run / "lora", run / "lora/step_000001"):
        names = {p.name for p in folder.glob("*.safetensors")}
        expected = {FILES[family]} | ({"pytorch_lora_weights.safetensors"}
                                      if kind in diffusers_kinds(family) else set())
        assert names == expected, folder
        suffixes = {k.rpartition(".")[2] for k in _read(folder / FILES[family])}
        marker = {"dora": "dora_scale", "lokr": "lokr_w1", "loha": "hada_w1_a"}[kind]
        assert marker in suffixes
    from safetensors import safe_open

    with safe_open(str(run / "checkpoints/step_000001/trainable.safetensors"), "pt") as fh:
        marker = {"dora": "lora_magnitude_vector", "lokr": "lokr_w1", "loha": "hada_w1_a"}
        assert any(marker[kind] in key for key in fh.keys())
    from core.headless import summarize_run

    capsys.readouterr()
    summarize_run(run, "done", tiny_workspace)
    out = capsys.readouterr().out
    if kind in diffusers_kinds(family):
        assert f"LoRA: {run / 'lora' / 'pytorch_lora_weights.safetensors'}" in out
    else:  # the summary names the file there is and says why
        assert f"LoRA: {run / 'lora' / FILES[family]}" in out
        assert "no pytorch_lora_weights.safetensors" in out


@pytest.mark.slow
def test_lokr_run_resumes_the_same_curve(tmp_path: Path, tiny_workspace: Path):
    cfg = _run_config(tmp_path, "sd15", "lokr", steps=4)
    cfg.train.checkpoint_every = 2
    reference = _train(cfg, tiny_workspace)
    resumed = _train(cfg, tiny_workspace, "--resume", "2")
    assert [resumed[s] for s in (3, 4)] == pytest.approx([reference[s] for s in (3, 4)],
                                                          rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("kind", ["dora", "lokr"])
def test_text_encoder_adapter_of_each_kind_is_saved(kind: str, tmp_path: Path,
                                                    tiny_workspace: Path):
    fam = get_family("sd15")
    c = fam.load(resolve_model_path("tiny:sd15", tiny_workspace))
    c.denoiser.add_adapter(adapter_config(kind, 4, 4.0, fam.lora_target_modules()))
    encoder = c.text_encoders[0]
    encoder.add_adapter(adapter_config(kind, 4, 4.0, fam.text_encoder_lora_targets))
    fam.save_lora(c, tmp_path)
    saved = _read(tmp_path / FILES["sd15"])
    te = {k for k in saved if k.startswith("lora_te_text_model_encoder_layers_0_self_attn_q_proj")}
    marker = "dora_scale" if kind == "dora" else "lokr_w1"
    assert any(k.endswith(marker) for k in te), sorted(saved)[:5]
    if kind == "dora":  # ComfyUI's output axis: [out, 1]
        q = next(k for k in te if k.endswith("dora_scale"))
        assert saved[q].shape == (encoder.config.hidden_size, 1)


@pytest.mark.parametrize("preset", ["chroma-lora", "z-image-lora", "flux2-lora",
                                    "qwen-image-lora"])
def test_check_accepts_every_kind_on_the_new_families(preset: str):
    """Every kind saves on chroma, z_image, qwen_image and flux2 (the rebuild test), so the
    check refuses a kind there only for the reason it does everywhere: a quantized base
    (the qwen-image preset's int8)."""
    from core.config import load_config
    from core.presets import preset_path

    cfg = load_config(preset_path(preset))
    for kind in ("dora", "lokr", "loha"):
        cfg.train.lora_kind = kind
        refused = [str(p) for p in validate_config(cfg) if p.where == "train.lora_kind"]
        if cfg.model.quantize == "none":
            assert not refused, refused
        else:
            assert len(refused) == 1 and "model.quantize" in refused[0], refused
            assert kind in refused[0]
    cfg.model.quantize = "none"
    assert not [p for p in validate_config(cfg) if p.where == "train.lora_kind"]

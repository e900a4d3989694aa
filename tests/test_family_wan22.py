"""Wan 2.2's two experts on tiny:wan22 (CPU, seconds each): the tiny model built in the
workspace with two different experts, each sample of a batch denoised by the expert of its
timestep, model.experts restricting the sigma draw and the trained weights to one expert,
each expert's LoRA files reloading in diffusers into its own transformer (and merging
there), the check's and the trainer's refusals, and a short training run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import small_config, train_in_process
from test_family_wan import add_lora  # on each trained expert: the wrapper's add_adapter

from core.config import Config, save_config
from core.data.collate import collate
from core.models.families.wan.experts import WanExperts
from core.models.families.wan.family import FAMILY as WAN
from core.models.tiny import resolve_model_path, tiny_family, tiny_names

LOW_FILE = "pytorch_lora_weights_low_noise.safetensors"
MAIN_FILE = "pytorch_lora_weights.safetensors"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="module")
def folder(workspace: Path) -> Path:
    return Path(resolve_model_path("tiny:wan22", workspace))


def run_config(path: str, experts: str = "both", **train: object) -> Config:
    cfg = Config()
    cfg.model.family, cfg.model.path, cfg.model.experts = "wan", path, experts
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def loaded(folder: Path, experts: str = "both", **train: object):
    """tiny:wan22 loaded, model.experts applied as the trainer applies it."""
    c = WAN.load(str(folder))
    WAN.configure_run(c, run_config(str(folder), experts, **train))
    return c


def batch_of(texts: list[dict], latents: torch.Tensor) -> dict:
    return collate([{**t, "latents": latents[i], "path": f"{i}.mp4", "caption": ""}
                    for i, t in enumerate(texts)])


def generate(pipe, embeds: torch.Tensor) -> torch.Tensor:
    """Three steps: t = 999 goes to the high-noise expert, 857 and 600 to the low one."""
    out = pipe(prompt_embeds=embeds, negative_prompt_embeds=torch.zeros_like(embeds),
               height=32, width=32, num_frames=1, num_inference_steps=3,
               generator=torch.Generator().manual_seed(0), output_type="np")
    return torch.as_tensor(out.frames)


def as_trained(c):
    """A plain WanPipeline of the loaded modules (the validation pipeline's components,
    the experts' split included), with whatever LoRA they carry."""
    from diffusers import WanPipeline

    pipe = WanPipeline(**WAN.validation_pipeline(c).components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_tiny_wan22_is_built_in_the_workspace_with_two_different_experts(
        workspace: Path, folder: Path) -> None:
    assert folder == workspace.absolute() / "models" / "tiny-wan22"
    assert tiny_family("wan22") == "wan" and "wan22" in tiny_names()
    index = json.loads((folder / "model_index.json").read_text())
    assert index["boundary_ratio"] == 0.875
    assert index["transformer_2"] == ["diffusers", "WanTransformer3DModel"]
    c = WAN.load(str(folder))
    experts = c.denoiser
    assert isinstance(experts, WanExperts) and experts.boundary_timestep == 875.0
    high = dict(experts.transformer.named_parameters())
    low = dict(experts.transformer_2.named_parameters())
    assert high.keys() == low.keys()
    differ = {k for k in high if not torch.equal(high[k], low[k])}  # norms start at 1 in both
    assert {"blocks.0.attn1.to_q.weight", "blocks.0.ffn.net.0.proj.weight",
            "proj_out.weight"} <= differ
    pipe = WAN.validation_pipeline(c)
    assert pipe.transformer is experts.transformer
    assert pipe.transformer_2 is experts.transformer_2 and pipe.config.boundary_ratio == 0.875


def test_each_sample_of_a_batch_goes_through_the_expert_of_its_timestep(folder: Path) -> None:
    c = WAN.load(str(folder))
    experts = c.denoiser
    texts = WAN.encode_prompts(c, ["a red circle", "a blue square", "a green triangle"])
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(3, 16, 2, 4, 4, generator=gen)
    # high, low, and the boundary itself (high, as WanPipeline switches below it)
    sample = WAN.noise_and_target(c, latents, timesteps=torch.tensor([950.0, 300.0, 875.0]),
                                  noise=torch.randn(latents.shape, generator=gen))
    embeds = torch.stack([t["prompt_embeds"] for t in texts])
    with torch.no_grad():
        pred = WAN.predict(c, sample, batch_of(texts, latents))

        def alone(expert, i: int) -> torch.Tensor:
            return expert(hidden_states=sample.noisy[i:i + 1],
                          timestep=sample.timesteps[i:i + 1],
                          encoder_hidden_states=embeds[i:i + 1], return_dict=False)[0]

        high, low = experts.transformer, experts.transformer_2
        for i, (own, other) in enumerate([(high, low), (low, high), (high, low)]):
            torch.testing.assert_close(pred[i:i + 1], alone(own, i), rtol=1e-5, atol=1e-5)
            assert (pred[i:i + 1] - alone(other, i)).abs().max() > 1e-3


@pytest.mark.parametrize("experts, median", [("high_noise", 0.944), ("low_noise", 0.618)])
def test_one_expert_draws_sigmas_only_in_its_range_renormalised(folder: Path, experts: str,
                                                                 median: float) -> None:
    c = loaded(folder, experts)
    latents = torch.zeros(2000, 16, 1, 2, 2)
    sample = WAN.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0),
                                  noise=torch.zeros_like(latents))
    high = sample.timesteps >= 875.0
    assert bool(high.all()) if experts == "high_noise" else not bool(high.any())
    # shift 3: sigma = 3u / (1 + 2u) >= 0.875 is u >= 0.7, so the draw renormalised above
    # has its median at u = 0.85 (sigma 0.944), the one below at u = 0.35 (sigma 0.618).
    assert float((sample.timesteps / 1000).median()) == pytest.approx(median, abs=0.01)


def test_both_experts_draw_sigmas_over_the_whole_range(folder: Path) -> None:
    c = loaded(folder, "both")
    latents = torch.zeros(2000, 16, 1, 2, 2)
    sample = WAN.noise_and_target(c, latents, generator=torch.Generator().manual_seed(0),
                                  noise=torch.zeros_like(latents))
    above = float((sample.timesteps >= 875.0).float().mean())
    assert above == pytest.approx(0.3, abs=0.03)  # P(u >= 0.7) of the shifted draw


@pytest.mark.parametrize("experts, adapted", [("both", {"transformer", "transformer_2"}),
                                              ("high_noise", {"transformer"}),
                                              ("low_noise", {"transformer_2"})])
def test_only_the_trained_experts_get_a_lora(folder: Path, experts: str,
                                             adapted: set[str]) -> None:
    from core.train.setup import add_trainable

    c = loaded(folder, experts)
    params = add_trainable(WAN, c.denoiser, run_config(str(folder), experts))
    names = [n for n, p in c.denoiser.named_parameters() if p.requires_grad]
    assert {n.split(".")[0] for n in names} == adapted and all("lora_" in n for n in names)
    assert len(params) == len(names) == 2 * 8 * len(adapted)  # q/k/v/out of both attentions


def test_a_full_fine_tune_of_one_expert_trains_only_that_expert(folder: Path) -> None:
    from core.train.setup import add_trainable

    c = loaded(folder, "high_noise", method="full")
    add_trainable(WAN, c.denoiser, run_config(str(folder), "high_noise", method="full"))
    trained = {n.split(".")[0] for n, p in c.denoiser.named_parameters() if p.requires_grad}
    assert trained == {"transformer"}
    assert all(p.requires_grad for p in c.denoiser.transformer.parameters())


def test_each_experts_lora_reloads_in_diffusers_into_its_own_transformer(
        folder: Path, workspace: Path, tmp_path: Path) -> None:
    from diffusers import WanPipeline
    from safetensors import safe_open

    from core.merge import fused_pipeline

    trained = loaded(folder, "both")
    add_lora(trained)
    files = WAN.save_lora(trained, tmp_path / "lora")
    assert {k: p.name for k, p in files.items()} == {
        "diffusers": MAIN_FILE, "diffusers_low_noise": LOW_FILE,
        "comfyui": "lora_comfyui_high_noise.safetensors",
        "comfyui_low_noise": "lora_comfyui_low_noise.safetensors"}
    with safe_open(str(files["comfyui_low_noise"]), "pt") as fh:
        assert "diffusion_model.blocks.0.self_attn.q.lora_A.weight" in set(fh.keys())
    embeds = WAN.encode_prompts(trained, ["a red circle"])[0]["prompt_embeds"][None].detach()
    with torch.no_grad():
        want = generate(as_trained(trained), embeds)

    pipe = WanPipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    base = generate(pipe, embeds)
    pipe.load_lora_weights(str(tmp_path / "lora"))  # the high-noise expert's, by default
    high_only = generate(pipe, embeds)
    pipe.load_lora_weights(str(tmp_path / "lora"), weight_name=LOW_FILE,
                           load_into_transformer_2=True)
    both = generate(pipe, embeds)
    assert (high_only - base).abs().max() > 1e-3 and (both - high_only).abs().max() > 1e-3
    torch.testing.assert_close(both, want, atol=1e-4, rtol=1e-4)
    pipe.unload_lora_weights()
    torch.testing.assert_close(generate(pipe, embeds), base)
    pipe.load_lora_weights(str(files["comfyui"]))
    pipe.load_lora_weights(str(files["comfyui_low_noise"]), load_into_transformer_2=True)
    torch.testing.assert_close(generate(pipe, embeds), want, atol=1e-4, rtol=1e-4)

    # --stage merge: the run's folder, each file fused into its expert, the split kept
    merged = fused_pipeline(run_config(str(folder)), workspace, tmp_path / "lora", 1.0)
    assert type(merged) is WanPipeline and merged.config.boundary_ratio == 0.875
    merged.set_progress_bar_config(disable=True)
    torch.testing.assert_close(generate(merged, embeds), want, atol=1e-4, rtol=1e-4)


def test_a_low_noise_runs_files_load_into_the_low_noise_expert(folder: Path,
                                                               tmp_path: Path) -> None:
    from diffusers import WanPipeline

    trained = loaded(folder, "low_noise")
    add_lora(trained)
    files = WAN.save_lora(trained, tmp_path / "lora")
    assert {k: p.name for k, p in files.items()} == {
        "diffusers": MAIN_FILE, "diffusers_low_noise": LOW_FILE,
        "comfyui": "lora_comfyui_low_noise.safetensors"}
    embeds = WAN.encode_prompts(trained, ["a red circle"])[0]["prompt_embeds"][None].detach()
    with torch.no_grad():
        want = generate(as_trained(trained), embeds)
    pipe = WanPipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    base = generate(pipe, embeds)
    pipe.load_lora_weights(str(tmp_path / "lora"), weight_name=LOW_FILE,
                           load_into_transformer_2=True)
    assert (generate(pipe, embeds) - base).abs().max() > 1e-3
    torch.testing.assert_close(generate(pipe, embeds), want, atol=1e-4, rtol=1e-4)
    # The run-folder file holds the low-noise expert too, and says so: this family's
    # pipeline (the merge's) loads it into transformer_2.
    fresh = WAN.load(str(folder))
    WAN.validation_pipeline(fresh).load_lora_weights(str(tmp_path / "lora"),
                                                     weight_name=MAIN_FILE)
    assert not getattr(fresh.denoiser.transformer, "peft_config", None)
    torch.testing.assert_close(generate(as_trained(fresh), embeds), want, atol=1e-4,
                               rtol=1e-4)


def test_one_expert_is_refused_for_a_model_with_one_transformer(workspace: Path, folder: Path,
                                                                 tmp_path: Path) -> None:
    from core.config.checks import validate_config

    def keys(cfg: Config) -> list[str]:
        return [p.where for p in WAN.config_problems(cfg)]

    assert keys(run_config("tiny:wan", "high_noise")) == ["model.experts"]
    assert keys(run_config("random:wan", "low_noise")) == ["model.experts"]
    assert keys(run_config("tiny:wan", "both")) == []
    assert keys(run_config("tiny:wan22", "high_noise")) == []
    assert keys(run_config(str(folder), "low_noise")) == []
    one = tmp_path / "wan21"
    one.mkdir()
    index = json.loads((folder / "model_index.json").read_text())
    (one / "model_index.json").write_text(json.dumps({**index, "transformer_2": [None, None],
                                                      "boundary_ratio": None}))
    assert keys(run_config(str(one), "high_noise")) == ["model.experts"]
    # A hub id is known only once loaded: the trainer refuses then.
    assert keys(run_config("Wan-AI/Wan2.1-T2V-14B-Diffusers", "high_noise")) == []
    assert keys(run_config("tiny:wan22", init_lora=str(tmp_path / "x.safetensors"))) == [
        "train.init_lora"]
    single = WAN.load(resolve_model_path("tiny:wan", workspace))
    with pytest.raises(ValueError, match="model.experts.*one transformer"):
        WAN.configure_run(single, run_config("tiny:wan", "high_noise"))
    # Another family does not read wan's own key: the check refuses it, naming wan.
    sd15 = run_config("tiny:sd15", "low_noise")
    sd15.model.family = "sd15"
    refused = [p for p in validate_config(sd15) if p.where == "model.experts"]
    assert len(refused) == 1 and "a wan key" in refused[0].message


def test_a_short_run_writes_both_experts_loras_and_a_validation_image(
        tmp_path: Path, workspace: Path) -> None:
    from safetensors.torch import load_file

    cfg = small_config(tmp_path, images=4, family="wan")
    cfg.model.path = "tiny:wan22"
    cfg.train.max_steps = cfg.train.eval_every = cfg.validation.every = 2
    # both experts checkpoint their blocks; bf16 timesteps still route at full precision
    cfg.train.gradient_checkpointing, cfg.train.mixed_precision = True, "bf16"
    cfg.validation.prompts = ["a red circle"]
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", workspace) == 0
    run = Path(cfg.output.dir)
    assert {p.name for p in (run / "lora").glob("*.safetensors")} == {
        MAIN_FILE, LOW_FILE, "lora_comfyui_high_noise.safetensors",
        "lora_comfyui_low_noise.safetensors"}
    assert (run / "validation/step_000002/00.png").is_file()
    trained = load_file(run / "checkpoints/step_000002/trainable.safetensors")
    assert {k.split(".")[0] for k in trained} == {"transformer", "transformer_2"}
    assert (workspace / "models/tiny-wan22/transformer_2").is_dir()  # built once, reused


@pytest.mark.slow
def test_two_processes_train_both_experts_when_their_batches_differ(tmp_path: Path,
                                                                   workspace: Path) -> None:
    """DDP (two CPU processes, one sample each): a process whose batch holds no sample of
    an expert still joins that expert's gradient exchange (experts._idle_term); without
    it the next step stops with DDP's "parameters that were not used" error."""
    import subprocess

    from tests.conftest import PYTHON, REPO

    cfg = small_config(tmp_path, images=4, family="wan")
    cfg.model.path = "tiny:wan22"
    cfg.train.max_steps, cfg.train.batch_size = 4, 1
    cfg.train.eval_every, cfg.validation.every = 4, 100
    cfg.validation.prompts = []
    cfg.launch.cpu, cfg.launch.num_processes = True, 2
    save_config(cfg, tmp_path / "run.toml")
    done = subprocess.run([PYTHON, "app.py", "--no-ui", "--workspace", str(workspace),
                           "--config", str(tmp_path / "run.toml"), "--stage", "all"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert (Path(cfg.output.dir) / "lora" / LOW_FILE).is_file()


def test_a_full_fine_tune_of_one_expert_saves_a_wan22_folder_diffusers_loads(
        tmp_path: Path, workspace: Path) -> None:
    from diffusers import DiffusionPipeline, WanPipeline

    cfg = small_config(tmp_path, images=4, family="wan")
    cfg.model.path, cfg.model.experts, cfg.train.method = "tiny:wan22", "high_noise", "full"
    cfg.train.max_steps, cfg.validation.prompts = 2, []
    save_config(cfg, tmp_path / "run.toml")
    assert train_in_process(tmp_path / "run.toml", workspace) == 0
    model = Path(cfg.output.dir) / "model"
    saved = DiffusionPipeline.from_pretrained(str(model), local_files_only=True)
    base = WanPipeline.from_pretrained(str(workspace / "models/tiny-wan22"),
                                       local_files_only=True)
    assert type(saved) is WanPipeline and saved.config.boundary_ratio == 0.875

    def changed(name: str) -> bool:
        old = dict(getattr(base, name).named_parameters())
        return any(not torch.equal(old[k], p) for k, p in
                   getattr(saved, name).named_parameters())

    assert changed("transformer") and not changed("transformer_2")

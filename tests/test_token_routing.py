"""train.token_routing (core/models/routing.py): on real tiny transformers (Wan, Flux,
Qwen-Image, SD3), the routed forward sends fewer tokens through the middle blocks with
their own rotary rows, equals the plain forward at 0 and outside a training step, gives
the same gradients under checkpointing, block swap and compiled blocks; a tiny Wan run
(LoRA, full fine-tune, swapped, compiled) trains and logs its routed tokens; the check refuses what
routing cannot serve."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from core.models.blocks import denoiser_stacks
from core.models.registry import get_family
from core.models.routing import TokenRouter, install
from tests.conftest import check_in_process, small_config, train_events

WAN, FLUX = get_family("wan"), get_family("flux")


def wan_model(layers: int = 4) -> Any:
    """A tiny Wan 2.1 transformer as tiny:wan's, with `layers` blocks (a middle to route
    around); inputs: 2 latent frames of 8x8 (32 tokens)."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24, in_channels=16,
        out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=1024)


def wan_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"hidden_states": torch.randn(2, 16, 2, 8, 8, generator=g),
            "timestep": torch.tensor([500, 200]),
            "encoder_hidden_states": torch.randn(2, 7, 32, generator=g)}


def routed(model: Any, family: Any, fraction: float) -> TokenRouter:
    return install(family.routing, model, denoiser_stacks(family, model), fraction)


def tokens_seen(blocks: Any) -> dict[int, list[int]]:
    """Each block's input token counts, call by call (forward hooks of the test's own)."""
    seen: dict[int, list[int]] = {}
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(
            lambda _m, args, kwargs, i=i: seen.setdefault(i, []).append(
                (args[0] if args else kwargs["hidden_states"]).shape[1]), with_kwargs=True)
    return seen


def test_routing_narrows_the_middle_blocks_only_in_a_training_step() -> None:
    model, x = wan_model(), wan_inputs()
    plain = model(**x).sample
    router = routed(model, WAN, 0.5)
    assert router.spans == [range(1, 3)]  # the middle half of 4 blocks
    seen = tokens_seen(model.blocks)
    with router.step(True):
        out = model(**x).sample
    assert seen == {0: [32], 1: [16], 2: [16], 3: [32]}
    assert out.shape == plain.shape and not torch.allclose(out, plain)
    assert router.take() == (2 * 16, 2 * 32)  # routed, seen: both items of the batch
    seen.clear()
    # Eval and validation: outside a step, in eval mode, or without gradients, no route.
    assert torch.equal(model(**x).sample, plain)
    with router.step(False):
        assert torch.equal(model(**x).sample, plain)
    with router.step(True), torch.no_grad():
        assert torch.equal(model(**x).sample, plain)
    assert set(map(tuple, seen.values())) == {(32, 32, 32)} and router.take() == (0, 0)


def test_fraction_zero_is_the_plain_forward() -> None:
    model, x = wan_model(), wan_inputs()
    plain = model(**x).sample
    router = routed(model, WAN, 0.0)
    with router.step(True):
        assert torch.equal(model(**x).sample, plain)


def test_per_token_timesteps_are_narrowed_with_their_tokens() -> None:
    # Wan 2.2 TI2V gives each token its own timestep: the blocks' [B, S, 6, D] projections.
    model, x = wan_model(), wan_inputs()
    x["timestep"] = torch.arange(64.0).view(2, 32) * 10
    router = routed(model, WAN, 0.5)
    temb: list[tuple[int, ...]] = []
    model.blocks[1].register_forward_pre_hook(lambda _m, args: temb.append(tuple(args[2].shape)))
    with router.step(True):
        out = model(**x).sample
    assert temb == [(2, 16, 6, 48)] and torch.isfinite(out).all()


def test_the_routed_blocks_get_the_kept_tokens_rotary_rows() -> None:
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)  # tiny:flux's shape, with blocks around a middle
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        guidance_embeds=True, axes_dims_rope=(4, 6, 6))
    txt_ids = torch.zeros(5, 3)
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0),
                                         indexing="ij"), -1).reshape(16, 3)
    router = routed(model, FLUX, 0.5)
    assert router.spans == [range(1, 3)]  # the last double block and the first single
    calls: list[Any] = []
    model.single_transformer_blocks[0].register_forward_pre_hook(
        lambda _m, args, kwargs: calls.append(kwargs), with_kwargs=True)
    g = torch.Generator().manual_seed(2)
    with router.step(True):
        model(hidden_states=torch.randn(1, 16, 64, generator=g),
              encoder_hidden_states=torch.randn(1, 5, 32, generator=g),
              pooled_projections=torch.randn(1, 32, generator=g), timestep=torch.tensor([0.5]),
              img_ids=img_ids, txt_ids=txt_ids, guidance=torch.tensor([1.0]))
        keep = router.routes[0].keep
    assert calls[0]["hidden_states"].shape[1] == len(keep) == 8
    # The rotary table of the text and the kept tokens' own ids, computed afresh.
    want = model.pos_embed(torch.cat([txt_ids, img_ids[keep]]))
    for got, expected in zip(calls[0]["image_rotary_emb"], want, strict=True):
        assert torch.equal(got, expected)


def test_sd3_routes_without_a_rotary_table() -> None:
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(0)  # tiny:sd3's shape, with blocks around a middle
    model = SD3Transformer2DModel(
        sample_size=32, patch_size=2, in_channels=16, out_channels=16, num_layers=4,
        attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
        joint_attention_dim=32, pooled_projection_dim=48, pos_embed_max_size=64)
    g = torch.Generator().manual_seed(2)
    x = {"hidden_states": torch.randn(1, 16, 8, 8, generator=g),
         "encoder_hidden_states": torch.randn(1, 5, 32, generator=g),
         "pooled_projections": torch.randn(1, 48, generator=g), "timestep": torch.tensor([500])}
    plain = model(**x).sample
    router = routed(model, get_family("sd3"), 0.5)
    seen = tokens_seen(model.transformer_blocks)
    with router.step(True):
        out = model(**x).sample
    assert seen == {0: [16], 1: [8], 2: [8], 3: [16]}
    assert torch.isfinite(out).all() and not torch.allclose(out, plain)


def test_qwen_image_blocks_get_their_image_rotary_rows_and_the_text_ones_whole() -> None:
    from diffusers import QwenImageTransformer2DModel

    qwen = get_family("qwen_image")
    torch.manual_seed(0)  # tiny:qwen_image's shape, with blocks around a middle
    model = QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=4, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, guidance_embeds=False,
        axes_dims_rope=(4, 6, 6))
    router = routed(model, qwen, 0.25)
    calls: list[Any] = []
    model.transformer_blocks[1].register_forward_pre_hook(
        lambda _m, args, kwargs: calls.append((args, kwargs)), with_kwargs=True)
    g = torch.Generator().manual_seed(2)
    shapes = [(1, 4, 4)]
    with router.step(True):
        model(hidden_states=torch.randn(1, 16, 64, generator=g),
              encoder_hidden_states=torch.randn(1, 6, 32, generator=g),
              encoder_hidden_states_mask=torch.ones(1, 6, dtype=torch.bool),
              timestep=torch.tensor([0.5]), img_shapes=shapes)
        keep = router.routes[0].keep
    args, kwargs = calls[0]
    hidden = args[0] if args else kwargs["hidden_states"]
    rope = args[4] if args else kwargs["image_rotary_emb"]
    assert hidden.shape[1] == len(keep) == 12
    image, text = model.pos_embed(shapes, max_txt_seq_len=6, device=torch.device("cpu"))
    assert torch.equal(rope[0], image[keep]) and torch.equal(rope[1], text)


def _grads(model: Any, fraction: float, prepare: Any = None,
           checkpointing: bool = True) -> list[torch.Tensor]:
    """One routed training forward and backward with checkpointed blocks (the same draw
    for the same seed) of a model whose query projections train, as a LoRA's would over
    a frozen base (what block swap streams); their gradients."""
    if checkpointing:
        model.enable_gradient_checkpointing()
    model.train().requires_grad_(False)
    trained = [p for name, p in model.named_parameters() if "to_q" in name]
    for param in trained:
        param.requires_grad_(True)
    router = routed(model, WAN, fraction)
    if prepare is not None:
        prepare(model)
    torch.manual_seed(3)
    with router.step(True):
        model(**wan_inputs()).sample.square().mean().backward()
    return [p.grad.clone() for p in trained]


@pytest.mark.slow  # compiles (10 s): make test runs it, make test-fast leaves it out
def test_checkpointed_block_swapped_and_compiled_blocks_route_alike() -> None:
    from core.models.block_swap import install as install_swap

    plain = _grads(wan_model(), 0.5)
    assert all(torch.isfinite(g).all() for g in plain) and any(g.abs().sum() > 0 for g in plain)
    # The recomputed forwards of the backward used the forward's draw: the gradients of
    # the routed blocks differ from unrouted ones, and equal a swapped or compiled run's.
    unrouted = _grads(wan_model(), 0.0)
    assert any(not torch.allclose(a, b) for a, b in zip(plain, unrouted, strict=True))
    for a, b in zip(plain, _grads(wan_model(), 0.5, checkpointing=False), strict=True):
        assert torch.allclose(a, b, atol=1e-6)  # recomputed forwards drew nothing new
    swapped = _grads(wan_model(), 0.5,
                     lambda m: install_swap(denoiser_stacks(WAN, m), 3, "cpu"))
    for a, b in zip(plain, swapped, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    compiled = _grads(wan_model(), 0.5, lambda m: [b.compile(dynamic=True, backend="aot_eager")
                                                   for b in m.blocks])
    for a, b in zip(plain, compiled, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_", ["plain", "full", "block_swap", pytest.param(
    "compile", marks=pytest.mark.slow)])
def test_a_routed_wan_run_trains_and_logs_its_routed_tokens(
        tmp_path: Path, tiny_workspace: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, with_: str) -> None:
    cfg = small_config(tmp_path, images=4, family="wan")
    cfg.train.token_routing = 0.5
    cfg.train.method = "full" if with_ == "full" else "lora"  # a full fine-tune routes too
    if with_ in ("block_swap", "compile"):  # the trainer's swapped or compiled blocks
        cfg.train.gradient_checkpointing = True
        cfg.model.blocks_to_swap = 1 if with_ == "block_swap" else 0
        cfg.train.compile = "blocks" if with_ == "compile" else "off"
        monkeypatch.setenv("TRAIN_COMPILE_BACKEND", "aot_eager")
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 2, 2, 100
    events = train_events(cfg, tmp_path, tiny_workspace)
    setup = [e for e in events if e["type"] == "token_routing"]
    assert setup and setup[0]["fraction"] == 0.5 and setup[0]["blocks"] == [[0, 1]]
    steps = [e for e in events if e["type"] == "step"]
    # 64-pixel images: 8x8 latents in 2x2 patches, 16 tokens, half routed, batch of 2.
    assert [(e["routed_tokens"], e["tokens"]) for e in steps] == [(16, 32), (16, 32)]
    assert all(e["loss"] == e["loss"] and 0 < e["loss"] < 100 for e in steps)
    assert any(e["type"] == "eval" for e in events)
    if with_ in ("block_swap", "compile"):  # the blocks really were swapped or compiled
        assert any(e["type"] == with_ for e in events)
    log = capsys.readouterr().out  # what train.log holds in a launched run
    assert "step 2/2 loss" in log and "routed 16/32 tokens" in log
    from core.runs.progress import parse_step_line

    lines = [line for line in log.splitlines() if "routed 16/32" in line]
    assert parse_step_line(lines[-1]).step == 2


def test_each_expert_of_wan22_routes_its_own_tokens(tmp_path: Path,
                                                    tiny_workspace: Path) -> None:
    cfg = small_config(tmp_path, images=4, family="wan")
    cfg.model.path, cfg.train.token_routing = "tiny:wan22", 0.5
    cfg.train.max_steps, cfg.train.eval_every, cfg.validation.every = 3, 100, 100
    events = train_events(cfg, tmp_path, tiny_workspace)
    setup = [e for e in events if e["type"] == "token_routing"][0]
    assert setup["blocks"] == [[0, 1], [0, 1]] and setup["of"] == [1, 1]  # two stacks
    # Whichever expert each item went to, half of its 16 tokens went around.
    assert [(e["routed_tokens"], e["tokens"]) for e in events
            if e["type"] == "step"] == [(16, 32)] * 3


def _errors(cfg: Any) -> list[str]:
    from core.config.checks import validate_config

    return [f"{p.where}: {p.message}" for p in validate_config(cfg) if p.level == "error"]


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_a_share_outside_zero_to_one_is_refused(tmp_path: Path, value: float) -> None:
    cfg = small_config(tmp_path, family="wan")
    cfg.train.token_routing = value
    assert any(e.startswith("train.token_routing") for e in _errors(cfg))
    cfg.train.token_routing = 0.5
    assert not _errors(cfg)


def test_a_family_without_routing_is_refused_at_check(tmp_path: Path) -> None:
    from core.config import save_config

    cfg = small_config(tmp_path, family="sd15")
    cfg.train.token_routing = 0.5
    save_config(cfg, tmp_path / "run.toml")
    done = check_in_process("--config", str(tmp_path / "run.toml"))
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "train.token_routing" in said and "sd15 declares no token routing" in said
    cfg.model.family, cfg.model.path, cfg.launch.distributed = "flux", "tiny:flux", "fsdp"
    assert any(e.startswith("train.token_routing") and "fsdp" in e for e in _errors(cfg))


def test_the_step_event_is_json_with_the_counts(tmp_path: Path) -> None:
    from core.train.report import Reporter

    reporter = Reporter(tmp_path, True, 3)
    reporter.routed(1, (5, 10))
    reporter.steps([(1, 0.5, 1e-4, 0), (2, 0.4, 1e-4, 0)])
    steps = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert steps[0]["routed_tokens"] == 5 and steps[0]["tokens"] == 10
    assert "routed_tokens" not in steps[1]

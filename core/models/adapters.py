"""Adapter kinds (`train.lora_kind`): how peft builds each one, and how its weights map to
the LyCORIS names that ComfyUI and A1111 read.

- lora: peft `LoraConfig`; kohya lora_down/lora_up + alpha.
- dora: `LoraConfig(use_dora=True)`: LoRA plus a learned magnitude per output channel;
  kohya lora_down/lora_up + alpha + `dora_scale`.
- lokr: peft `LoKrConfig`: the update is a Kronecker product w1 (x) w2, either factor
  full or rank-decomposed; `lokr_w1` or `lokr_w1_a/b`, `lokr_w2` or `lokr_w2_a/b`, alpha.
- loha: peft `LoHaConfig`: the update is the Hadamard product of two low-rank products;
  `hada_w1_a/b`, `hada_w2_a/b`, alpha.

peft's parameter names and orientations are LyCORIS's (peft ported LyCORIS's modules), and
ComfyUI (comfy/weight_adapter/{lora,lokr,loha}.py, base.py) rebuilds the same update from
them: lora up @ down; LoHa (w1_a @ w1_b) * (w2_a @ w2_b); LoKr kron(w1, w2), with conv
weights flattened the same way and reshaped to the layer's weight. Two places differ and
are converted here (checked numerically in tests/test_lora_kinds.py):

- alpha. peft scales every kind by alpha / r. ComfyUI does too (r read from lora_down,
  hada_w1_b, or lokr_w1_b/lokr_w2_b), except a LoKr module whose two factors are both
  full matrices: there it applies no scale (alpha is ignored, as in LyCORIS, which writes
  alpha = r then). Such a module gets alpha / r multiplied into lokr_w1.
- DoRA. peft keeps one magnitude per output channel and normalises each output row of
  W + dW. ComfyUI reads a `dora_scale` of shape [out, 1, ...] as that (output-axis) form
  but divides by the row norms of the base W, not of W + dW (comfy/weight_adapter/base.py
  `weight_decompose`). The saved dora_scale is therefore magnitude * |W|row / |W + dW|row,
  which makes ComfyUI's weight equal peft's. A1111 applies DoRA on the input axis only
  (one scale per input column), a different decomposition: it cannot load peft's DoRA.

diffusers' `load_lora_weights` loads LoRA and DoRA (pytorch_lora_weights.safetensors) into
every pipeline here. In diffusers 0.42 it loads LoKr into the Z-Image and FLUX.2 pipelines
only (ZImageLoraLoaderMixin / Flux2LoraLoaderMixin build a LoKrConfig from the file's
metadata; the others refuse keys without "lora"), and LoHa into none. So a LoKr run writes
the diffusers file for z_image and flux2 (`diffusers_kinds`), and LoKr elsewhere and LoHa
everywhere write only the kohya/LyCORIS (or ComfyUI) file. tests/test_lora_kinds.py
reloads every diffusers file written and compares the merged weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LORA_KINDS: tuple[str, ...] = ("lora", "dora", "lokr", "loha")
# Kinds diffusers' load_lora_weights can load into every family here.
DIFFUSERS_KINDS: tuple[str, ...] = ("lora", "dora")


def lycoris_only_note() -> str:
    """Why a lokr/loha run writes no diffusers file, naming the families (registry's)."""
    from core.models.registry import names_where

    return ("train.lora_kind lokr/loha: diffusers' load_lora_weights cannot load this kind "
            "into this pipeline (LoKr loads only into "
            f"{names_where(lambda f: f.diffusers_lokr)}; LoHa into none), so no "
            "pytorch_lora_weights.safetensors is written, only the kohya/LyCORIS ("
            f"{names_where(lambda f: f.prediction != 'flow_matching')}) or ComfyUI (the "
            "others) file")


def diffusers_kinds(family: str) -> tuple[str, ...]:
    """The adapter kinds whose diffusers file `family`'s pipeline loads."""
    from core.models.registry import get_family

    # The family says whether its pipeline loads LoKr (`diffusers_lokr`, module docstring).
    return DIFFUSERS_KINDS + (("lokr",) if get_family(family).diffusers_lokr else ())

# peft's adapter parameters by kind, as get_peft_model_state_dict names them.
_PARAMS: dict[str, tuple[str, ...]] = {
    "lora": ("lora_A.weight", "lora_B.weight"),
    "dora": ("lora_A.weight", "lora_B.weight", "lora_magnitude_vector"),
    "lokr": ("lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b",
             "lokr_t2"),
    "loha": ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2"),
}
ADAPTER_PARAMS: tuple[str, ...] = tuple(dict.fromkeys(p for ps in _PARAMS.values() for p in ps))


def adapter_config(kind: str, rank: int, alpha: float, targets: list[str]) -> Any:
    """The peft config of `kind` on `targets`. LoRA and DoRA start with gaussian A and
    zero B (diffusers' examples); LoKr and LoHa with peft's defaults (one factor zero),
    so every kind starts as the unchanged base model."""
    if kind in ("lora", "dora"):
        from peft import LoraConfig

        return LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian",
                          use_dora=kind == "dora", target_modules=targets)
    if kind == "lokr":
        from peft import LoKrConfig

        return LoKrConfig(r=rank, alpha=alpha, target_modules=targets)
    if kind == "loha":
        from peft import LoHaConfig

        return LoHaConfig(r=rank, alpha=alpha, target_modules=targets)
    raise ValueError(f"train.lora_kind must be one of {', '.join(LORA_KINDS)}; got {kind!r}")


def adapter_kind(config: Any) -> str:
    """The kind of a peft adapter config."""
    name = type(config).__name__
    if name == "LoKrConfig":
        return "lokr"
    if name == "LoHaConfig":
        return "loha"
    if name == "LoraConfig":
        return "dora" if getattr(config, "use_dora", False) else "lora"
    raise ValueError(f"unsupported adapter {name}: train.lora_kind supports "
                     f"{', '.join(LORA_KINDS)}")


def config_alpha(config: Any) -> float:
    """The config's alpha: LoraConfig.lora_alpha, or the LyCORIS configs' alpha."""
    alpha = getattr(config, "lora_alpha", None)
    return float(config.alpha if alpha is None else alpha)


def split_key(key: str) -> tuple[str, str]:
    """("down_blocks.0...to_q", "lora_A.weight") from a peft state-dict key."""
    for param in ADAPTER_PARAMS:
        if key.endswith("." + param):
            return key[:-len(param) - 1], param
    raise ValueError(f"not an adapter weight: {key}")


def lycoris_module(kind: str, weights: dict[str, Any], alpha: float, rank: int,
                   base_weight: Callable[[], Any] | None = None,
                   lora_names: tuple[str, str] = ("lora_down.weight", "lora_up.weight"),
                   ) -> dict[str, Any]:
    """One module's tensors by suffix, as ComfyUI reads them (see the module docstring).

    lora_names: the names of A and B (kohya's lora_down/lora_up, or ComfyUI's
    diffusers-style lora_A/lora_B). base_weight: the frozen layer's weight, for DoRA.
    """
    import torch

    out: dict[str, Any] = {"alpha": torch.tensor(float(alpha))}
    if kind in ("lora", "dora"):
        out[lora_names[0]] = weights["lora_A.weight"]
        out[lora_names[1]] = weights["lora_B.weight"]
        if kind == "dora":
            if base_weight is None:
                raise ValueError("a DoRA module needs its base weight to be saved")
            out["dora_scale"] = comfy_dora_scale(
                weights["lora_A.weight"], weights["lora_B.weight"],
                weights["lora_magnitude_vector"], alpha / rank, base_weight())
        return out
    out.update(weights)
    if kind == "lokr" and "lokr_w1" in weights and "lokr_w2" in weights:
        # Both factors full: ComfyUI applies no alpha / r, so it goes into w1.
        out["lokr_w1"] = weights["lokr_w1"] * (alpha / rank)
        out["alpha"] = torch.tensor(float(rank))
    return out


def comfy_dora_scale(down: Any, up: Any, magnitude: Any, scale: float, weight: Any) -> Any:
    """dora_scale [out, 1, ...] such that ComfyUI's output-axis weight_decompose,
    (W + dW) * dora_scale / |W|row, equals peft's (W + dW) * m / |W + dW|row."""
    w = weight.detach().float()
    out = w.shape[0]
    delta = (up.detach().float().flatten(1) @ down.detach().float().flatten(1))
    delta = delta.reshape(w.shape) * scale
    base_norm = w.reshape(out, -1).norm(dim=1)
    merged_norm = (w + delta).reshape(out, -1).norm(dim=1)
    m = magnitude.detach().float().reshape(out)
    return (m * base_norm / merged_norm).reshape(out, *[1] * (w.dim() - 1))


def network_metadata(kind: str) -> dict[str, str]:
    """kohya/LyCORIS metadata naming the network module and algorithm."""
    import json

    if kind == "lora":
        return {"ss_network_module": "networks.lora"}
    algo = {"dora": "lora", "lokr": "lokr", "loha": "loha"}[kind]
    args = {"algo": algo, **({"dora_wd": "True"} if kind == "dora" else {})}
    return {"ss_network_module": "lycoris.kohya", "ss_network_args": json.dumps(args)}

"""Wan 2.2's two experts as one denoiser: the module the trainer trains, evaluates and
saves in place of a single transformer (imported when a two-expert model loads).

Wan 2.2 A14B holds two WanTransformer3DModel of the same shape: `transformer`, the
high-noise expert, denoises while the timestep t >= boundary_ratio * num_train_timesteps,
and `transformer_2`, the low-noise expert, below (WanPipeline.__call__). `WanExperts`
holds both and routes every sample of a batch to the expert whose range holds its
timestep, so the trainer's one forward per batch trains each expert on its own noise
levels, and the loss, the eval and validation see what inference runs.

Why one module and not two denoisers: the trainer, its checkpoints, EMA, DDP and the
optimizer all take one `Components.denoiser`; this wrapper gives them what they call on
it (add_adapter, enable_gradient_checkpointing, requires_grad_, dtype, parameters,
train/eval, to, forward) and keeps the experts as its submodules under their pipeline
names, so the checkpoint names say which expert a weight belongs to.

`trained_expert` (model.experts, set before the adapter is added): "both", or the one
expert that gets the LoRA (or, in a full fine-tune, the weights that train); the family
then draws sigmas only in that expert's range (`holds`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from core.models.families.wan.expert_checks import BOTH, HIGH, LOW


class WanExperts(torch.nn.Module):
    """Two Wan transformers split at a boundary timestep (see the module docstring)."""

    def __init__(self, transformer: Any, transformer_2: Any, boundary_ratio: float,
                 num_train_timesteps: int) -> None:
        super().__init__()
        self.transformer = transformer
        self.transformer_2 = transformer_2
        self.boundary_ratio = float(boundary_ratio)
        # As WanPipeline computes it: timesteps at or above it are the high expert's.
        self.boundary_timestep = self.boundary_ratio * num_train_timesteps
        self.trained_expert = BOTH
        # model.offload_inactive_expert: which expert's weights are on the device
        # (core/models/block_swap.py ModuleParking), or None when both stay there.
        self.parking: Any = None

    def take_turns(self, device: Any, held_elsewhere: set[int]) -> None:
        """The experts take turns on `device`: a training step brings in those its batch
        uses, and a pipeline's call of one expert (validation, without gradients) that
        one; the other waits in host memory."""
        from core.models.block_swap import ModuleParking

        experts = [self.transformer, self.transformer_2]
        pin = torch.device(device).type == "cuda"
        self.parking = ModuleParking(experts, device, held_elsewhere, pin=pin)

        def alone(module: Any, args: Any) -> None:
            if not torch.is_grad_enabled():
                self.parking.keep_only([module])

        for expert in experts:
            expert.register_forward_pre_hook(alone)

    # ------------------------------------------------------------ what it holds

    def experts(self) -> dict[str, Any]:
        """The experts by name (high_noise, low_noise)."""
        return {HIGH: self.transformer, LOW: self.transformer_2}

    def trained_experts(self) -> dict[str, Any]:
        """The experts that train: both, or the one model.experts names."""
        return {name: module for name, module in self.experts().items()
                if self.trained_expert in (BOTH, name)}

    @property
    def dtype(self) -> Any:
        return self.transformer.dtype

    @property
    def device(self) -> Any:
        return self.transformer.device

    @property
    def config(self) -> Any:
        """The high-noise expert's config (both have the same shape)."""
        return self.transformer.config

    def is_high(self, timesteps: Any) -> Any:
        """Which timesteps (scheduler scale) the high-noise expert denoises."""
        return timesteps >= self.boundary_timestep

    def holds(self, timesteps: Any) -> Any:
        """Which timesteps lie in the trained expert's range (all of them for both)."""
        high = self.is_high(timesteps)
        return {BOTH: torch.ones_like(high), HIGH: high, LOW: ~high}[self.trained_expert]

    # ------------------------------------------------------------ what the trainer calls

    def add_adapter(self, adapter_config: Any, adapter_name: str = "default") -> None:
        """The adapter on each trained expert (each its own peft adapter, so each saves
        as a Wan LoRA of its own)."""
        for expert in self.trained_experts().values():
            expert.add_adapter(copy.deepcopy(adapter_config), adapter_name=adapter_name)

    def enable_gradient_checkpointing(self) -> None:
        for expert in self.experts().values():
            expert.enable_gradient_checkpointing()

    def disable_gradient_checkpointing(self) -> None:
        for expert in self.experts().values():
            expert.disable_gradient_checkpointing()

    def requires_grad_(self, requires_grad: bool = True) -> WanExperts:
        """Freezing freezes both; unfreezing (a full fine-tune) only the trained ones."""
        if not requires_grad:
            return super().requires_grad_(False)
        for expert in self.trained_experts().values():
            expert.requires_grad_(True)
        return self

    def forward(self, hidden_states: Any, timestep: Any, encoder_hidden_states: Any,
                return_dict: bool = True, **kwargs: Any) -> Any:
        """Each sample through its own expert, the outputs put back in batch order.
        `timestep` [B] (or one for all) routes at full precision; each expert gets it in
        its own dtype, as the family's single-transformer predict gives it."""
        batch = hidden_states.shape[0]
        t = timestep.reshape(-1)
        t = t.expand(batch) if t.numel() == 1 else t
        high = self.is_high(t)
        if self.parking is not None:  # between steps: the experts this batch uses
            self.parking.keep_only([e for e, chosen in ((self.transformer, high),
                                                        (self.transformer_2, ~high))
                                    if bool(chosen.any())])
        outputs, order, idle = [], [], []
        for expert, chosen in ((self.transformer, high), (self.transformer_2, ~high)):
            index = chosen.nonzero().flatten()
            if index.numel() == 0:
                idle.append(expert)
                continue
            outputs.append(expert(hidden_states=hidden_states[index],
                                  timestep=t[index].to(expert.dtype),
                                  encoder_hidden_states=encoder_hidden_states[index],
                                  return_dict=False, **kwargs)[0])
            order.append(index)
        out = torch.cat(outputs)[torch.argsort(torch.cat(order))] + _idle_term(idle)
        if return_dict:
            from diffusers.models.modeling_outputs import Transformer2DModelOutput

            return Transformer2DModelOutput(sample=out)
        return (out,)


def _idle_term(idle: list[Any]) -> Any:
    """Zero, tied to the trained weights of the experts no sample of this batch went to,
    when several processes train: DDP (without find_unused_parameters) wants every
    trained weight in every backward, and another process's batch may use that expert."""
    import torch.distributed as dist

    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not (several and torch.is_grad_enabled()):
        return 0.0
    params = [p for expert in idle for p in expert.parameters() if p.requires_grad]
    return sum(p.sum() for p in params) * 0.0 if params else 0.0


def draw_within(draw: Any, n: int, keep: Any, rounds: int = 1000) -> Any:
    """n values of `draw(k)` (k values a call) for which `keep` holds: the draw's own
    density restricted to that set and renormalised (rejection: the others are drawn
    again). Raises ValueError when the set is (almost) never drawn."""
    kept: list[Any] = []
    count = 0
    for _ in range(rounds):
        values = draw(max(2 * n, 64))
        values = values[keep(values)]
        kept.append(values)
        count += values.numel()
        if count >= n:
            return torch.cat(kept)[:n]
    raise ValueError(f"the sigma draw almost never falls in the trained expert's range "
                     f"({count} of {rounds * max(2 * n, 64)} draws): set model.experts = "
                     "\"both\" or change train.timestep_sampling / train.flow_shift")

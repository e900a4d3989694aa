"""launch.distributed = "fsdp": the denoiser sharded with accelerate's FSDP2 plugin.

What changes against DDP (full fine-tunes only; core/config/distributed.py refuses the
rest):

- The plugin: FSDP2, each block named in the denoiser's `_no_split_modules` a shard unit
  (transformer_based_wrap), full state dicts. On the CPU accelerate keeps the state
  MULTI_CPU (gloo) and ignores the plugin, as it only shards on GPUs; torch's
  `fully_shard` runs on the CPU all the same, so the trainer turns FSDP on itself there
  (`enable_on_cpu`), which is how the tests run it on 2 CPU processes.
- Every forward all-gathers the shards: eval and validation run on every process (the
  same computation), and only the main process reports and writes.
- Checkpoints hold the full weights and the full optimizer state (gathered to the main
  process), so the files look as a DDP run's do and a resume reshards them; the final
  model/ is an unsharded copy of the denoiser built on the main process.
"""

from __future__ import annotations

import os
from typing import Any


def wanted(cfg: Any) -> bool:
    """Shard this run: launch.distributed = "fsdp" over more than one process."""
    return cfg.launch.distributed == "fsdp" and int(os.environ.get("WORLD_SIZE", "1")) > 1


def make_plugin() -> Any:
    from accelerate.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
        state_dict_type="FULL_STATE_DICT", reshard_after_forward=True,
        cpu_ram_efficient_loading=False)


def enable_on_cpu(accelerator: Any, plugin: Any) -> None:
    """accelerate sets DistributedType.FSDP only for GPU-type devices; on the CPU (gloo)
    the plugin would be dropped silently and the run would be DDP. Promote the state, so
    `prepare` shards with fully_shard as it does on GPUs."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.MULTI_CPU:
        accelerator.state.distributed_type = DistributedType.FSDP
        accelerator.state.fsdp_plugin = plugin
        if accelerator.mixed_precision != "no":  # what accelerate does on GPUs
            plugin.set_mixed_precision(accelerator.mixed_precision)
        # Every later AcceleratorState() (set_seed's, say) copies PartialState's type
        # back in; accelerate writes FSDP there too when it sets FSDP up on GPUs.
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    if not accelerator.is_fsdp2:
        raise RuntimeError(f"launch.distributed = \"fsdp\" asked for FSDP2, but accelerate "
                           f"set up {accelerator.distributed_type}")


def is_sharded(accelerator: Any) -> bool:
    return bool(getattr(accelerator, "is_fsdp2", False))


def describe(model: Any, processes: int) -> str:
    """The log line saying the denoiser is sharded: this process's share of it."""
    own = total = 0
    for param in model.parameters():
        total += param.numel()
        local = param.to_local() if hasattr(param, "to_local") else param
        own += local.numel()
    return (f"launch.distributed = fsdp: the denoiser is sharded over {processes} "
            f"processes (FSDP2); this one holds {own} of its {total} weights")


def _options(**extra: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **extra)


def full_state(model: Any) -> dict[str, Any]:
    """The whole model's state dict on the main process's CPU (empty elsewhere); every
    process must call it (it all-gathers)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(cpu_offload=True))


def full_optimizer_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The optimizer's state, gathered like `full_state` (keys: parameter names)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, _inner(optimizer), options=_options(cpu_offload=True))


def load_full_state(model: Any, optimizer: Any, weights: dict[str, Any],
                    optimizer_state: dict[str, Any]) -> None:
    """A checkpoint's full weights and optimizer state, resharded onto this process
    (every process read the files)."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    set_model_state_dict(model, weights, options=_options())
    set_optimizer_state_dict(model, _inner(optimizer), optimizer_state, options=_options())


def unsharded_copy(model_class: type, model: Any, state: dict[str, Any]) -> Any:
    """A plain (unsharded) denoiser of `model_class` holding `state` (main process)."""
    copy = model_class.from_config(model.config)
    copy.load_state_dict(state)
    return copy.eval()


class Frozen:
    """A state dict where save_checkpoint expects an object with `state_dict()`."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer

"""train.compile's rules: what compiling the denoiser's blocks cannot be combined with,
each refusal naming the key and the fix (core/train/compiling.py does the compiling)."""

from __future__ import annotations

from core.config.block_swap import parks_inactive_expert
from core.config.schema import Config
from core.models.registry import family_or_defaults
from core.problems import Problem, error

KEY = "train.compile"


def compile_problems(cfg: Config) -> list[Problem]:
    if cfg.train.compile == "off":
        return []
    said = f"\"{cfg.train.compile}\""
    if not family_or_defaults(cfg.model.family).block_lists:
        return [error(KEY, f"{said}: {cfg.model.family} declares no repeated transformer "
                           "blocks to compile (a UNet); set it to \"off\"")]
    out = []
    # Each of these changes a block's weights under the compiled code at every step
    # (swapped or parked weights replaced, quantized tensor subclasses), which would
    # recompile or break the graph at every block: refused rather than slow.
    if cfg.model.quantize != "none":
        out.append(error(KEY, f"{said} with model.quantize = \"{cfg.model.quantize}\": "
                              "quantized weights are not compiled yet; set one of them to "
                              "\"off\"/\"none\""))
    if cfg.model.blocks_to_swap:
        out.append(error(KEY, f"{said} with model.blocks_to_swap = "
                              f"{cfg.model.blocks_to_swap}: the swapped blocks' weights move "
                              "at every step, which compiled blocks cannot follow; set "
                              "train.compile = \"off\" or model.blocks_to_swap = 0"))
    elif parks_inactive_expert(cfg):
        out.append(error(KEY, f"{said} with model.offload_inactive_expert on: the idle "
                              "expert's weights move between steps; set train.compile = "
                              "\"off\" or model.offload_inactive_expert = \"off\""))
    if cfg.launch.distributed == "fsdp":
        out.append(error(KEY, f"{said} with launch.distributed = \"fsdp\": sharded blocks "
                              "are not compiled; set train.compile = \"off\" or use ddp"))
    return out

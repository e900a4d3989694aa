"""The memory estimate as `--stage check` and the Training tab print it: its parts per
phase (training, building the caches, a validation round) and the `memory:` lines. The
figures come from core/memory/estimate.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.problems import Problem, warning

GIB = 1024 ** 3
CUDA_CONTEXT = "CUDA context"


@dataclass
class MemoryPart:
    name: str  # "frozen weights", "trainable", "gradients", "optimizer", "activations"
    bytes: int
    exact: bool = True


@dataclass
class FitPlan:
    """The settings with which an estimate fits its card (core/memory/fit.py)."""

    changes: dict[str, Any] = field(default_factory=dict)  # "section.key" -> value
    per_gpu_bytes: int = 0  # the estimate with the changes
    host_pinned_bytes: int = 0

    def set_items(self) -> list[str]:
        """The changes as `--set` items, as a shell passes them (true, int8, 8)."""
        return [f"{key}={_toml(value).strip(chr(34))}" for key, value in self.changes.items()]

    def label(self) -> str:
        return ", ".join(f"{key} = {_toml(value)}" for key, value in self.changes.items())


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


@dataclass
class MemoryEstimate:
    parts: list[MemoryPart] = field(default_factory=list)  # training, on one GPU
    device_total_bytes: int | None = None  # the detected GPU's memory, when there is one
    caching: list[MemoryPart] = field(default_factory=list)  # building caches, before
    validation: list[MemoryPart] = field(default_factory=list)  # a validation round
    shape: str = ""  # what the activations were estimated from
    validation_shape: str = ""  # the validation images' size
    device_name: str = ""
    cpu: bool = False  # a CPU run: every part in RAM at once, no caching phase apart
    ram: list[MemoryPart] | None = None  # a GPU run on a machine without one: its CPU run
    unknown: str | None = None  # why there is no figure (then there are no parts)
    advice: list[str] = field(default_factory=list)  # settings that would lower it
    # model.blocks_to_swap: what the swapped blocks hold in pinned host memory (per
    # machine), the most blocks a stack has (None: the family has none), and the
    # smallest count with which the estimate fits its card (None: fits, or none does).
    host: list[MemoryPart] = field(default_factory=list)
    # Host memory per machine (core/memory/host.py): once everything is loaded, and
    # while training (the pinned `host` parts among them). Empty for a CPU run.
    host_loading: list[MemoryPart] = field(default_factory=list)
    host_training: list[MemoryPart] = field(default_factory=list)
    max_blocks: int | None = None
    # The settings with which the estimate fits its card with the presets' margin, when
    # it does not fit (core/memory/fit.py): the Training tab's button, the check's --set.
    fit: FitPlan | None = None
    planned: bool = False  # device_total_bytes is launch.gpu_memory_gib's, not found here

    @property
    def swap_fit(self) -> int | None:
        """The fit's model.blocks_to_swap, when it changes that."""
        return self.fit.changes.get("model.blocks_to_swap") if self.fit else None

    @property
    def host_peak_bytes(self) -> int:
        return max(sum(p.bytes for p in self.host_loading),
                   sum(p.bytes for p in self.host_training))

    @property
    def host_peak_phase(self) -> str:
        """"loading" or "training": where the host memory's peak falls."""
        training = sum(p.bytes for p in self.host_training)
        return "training" if training > sum(p.bytes for p in self.host_loading) else "loading"

    @property
    def training_bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    @property
    def caching_bytes(self) -> int:
        return sum(p.bytes for p in self.caching)

    @property
    def validation_bytes(self) -> int:
        return sum(p.bytes for p in self.validation)

    def _phase_bytes(self) -> dict[str, int]:
        return {"training": self.training_bytes, "caching": self.caching_bytes,
                "validation": self.validation_bytes}

    @property
    def dominant(self) -> str:
        """The phase that needs the most: "training", "caching" or "validation"."""
        phases = self._phase_bytes()
        return max(phases, key=lambda name: (phases[name], name == "training"))

    @property
    def total_bytes(self) -> int:
        """The per-GPU figure: the largest of the phases."""
        return max(self._phase_bytes().values())

    def _phase_texts(self) -> dict[str, tuple[str, str, str]]:
        """Per phase present: (its note on the first line, its label on a line of its
        own, its parts)."""
        out = {"training": ("", "training", f"{_sum_text(self.parts)} (activations "
                                            f"estimated from {self.shape})")}
        if self.caching:
            out["caching"] = ("; building the caches dominates", "building caches first",
                              f"{_sum_text(self.caching)} (text encoders and VAE on the "
                              "GPU; the denoiser comes after)")
        if self.validation:
            out["validation"] = ("; validation dominates", "validation",
                                 f"{_sum_text(self.validation)} ({self.validation_shape})")
        return out

    def lines(self) -> list[str]:
        """The first starts with `memory:` and gives the per-GPU figure in GiB."""
        if self.unknown is not None:
            return [f"memory: unknown ({self.unknown})"]
        texts, dominant, sizes = self._phase_texts(), self.dominant, self._phase_bytes()
        if self.ram is not None:  # what this machine will do comes first
            ram = sum(p.bytes for p in self.ram)
            return [f"memory: {_total(ram)} GiB of RAM (estimate; this machine has no GPU, "
                    f"so the run goes on its CPU) = {_sum_text(self.ram)} (activations "
                    f"estimated from {self.shape})",
                    f"  on a GPU: {_total(self.total_bytes)} GiB per GPU = "
                    f"{texts[dominant][2]}", *self._host_lines()]
        where = "per process (CPU run)" if self.cpu else "per GPU"
        note, _, text = texts[dominant]
        out = [f"memory: {_total(self.total_bytes)} GiB {where} (estimate{note}) = {text}"]
        out += [f"  {label}: {_total(sizes[name])} GiB = {text}"
                for name, (_, label, text) in texts.items() if name != dominant]
        out += self._host_lines()
        over = self.over_the_card()
        if over is not None:
            out.append(str(over))
        if self.fit is not None:
            out.append("  to fit: " + " ".join(f"--set {item}" for item in self.fit.set_items()))
        return out

    def over_the_card(self) -> Problem | None:
        """A warning when the estimate is more than the GPU has, with the settings that
        would fit (the launch shows it beside its button too, before anything loads)."""
        if self.device_total_bytes is None or self.total_bytes <= self.device_total_bytes:
            return None
        gpu = f"{_total(self.device_total_bytes)} GiB" + (
            f", {self.device_name}" if self.device_name else "")
        whose = "the planned GPU" if self.planned else "this machine's GPU"
        hint = f"; try {', '.join(self.advice)}" if self.advice else ""
        return warning("memory", f"the estimate ({_total(self.total_bytes)} GiB) is more "
                                 f"than {whose} has ({gpu}){hint}")


    def _host_lines(self) -> list[str]:
        """The host memory per machine at its peak, then the other phase; the pinned
        copies of swapped blocks named apart."""
        if not self.host_loading:
            return []
        phases = {"loading": self.host_loading, "training": self.host_training}
        peak = self.host_peak_phase
        other = "training" if peak == "loading" else "loading"
        pinned = sum(p.bytes for p in self.host)
        pinned_text = f" ({_total(pinned)} GiB pinned: {_sum_text(self.host)})" if pinned else ""
        return [f"  host memory: {_total(self.host_peak_bytes)} GiB per machine at its peak, "
                f"{peak} = {_sum_text(phases[peak])}; {other} "
                f"{_total(sum(p.bytes for p in phases[other]))} GiB{pinned_text}"]


def _total(n: int) -> str:
    return f"{n / GIB:.1f}" if n >= GIB else f"{n / GIB:.2f}"


def _part_text(p: MemoryPart) -> str:
    v = p.bytes / GIB
    number = f"{v:.1f}" if v >= 1 else f"{v:.2f}" if v >= 0.005 else "<0.01"
    return f"{p.name} {'' if p.exact else '~'}{number} GiB"


def _sum_text(parts: list[MemoryPart]) -> str:
    return " + ".join(_part_text(p) for p in parts if p.bytes > 0)

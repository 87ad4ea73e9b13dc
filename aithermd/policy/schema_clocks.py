"""The ``gpu_clocks`` rule of a policy file (:mod:`aithermd.policy.schema` imports it into ``Rule``): the
top of a GPU's locked SM clock range, and its efficient search."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from aithermd.policy import kinds
from aithermd.policy.schema import GpuSelector, RuleBase
from aithermd.policy.values import ClockValue


class GpuClocksRule(RuleBase, kinds.GpuClocksRule):
    """The top of a GPU's locked SM clock range (``nvmlDeviceSetGpuLockedClocks``, Volta and newer):
    MHz, % of the card's top clock, ``min`` (its lowest), ``max`` (unlocked), or ``efficient`` — the same
    search as ``limit: efficient`` over the clock: for memory-bound work (LLM decode) that draws far
    below any power limit, and ``min`` for a card held high while idle. A knob no rule decides is handed
    back: the lock is reset."""

    kind: Literal["gpu_clocks"]
    gpus: GpuSelector = "all"
    max_mhz: ClockValue
    max_slowdown_pct: Annotated[float, Field(gt=0, le=20, description=(
        "efficient: the most throughput the job may lose against the unlocked clock, %"))] | None = None
    step_pct: Annotated[float, Field(ge=1, le=20, description=(
        "efficient: each step down, % of the card's top clock"))] | None = None
    measure_s: Annotated[float, Field(ge=5, le=600, description=(
        "efficient: the measurement window of each step, s"))] | None = None
    floor_pct: Annotated[float, Field(ge=5, le=100, description=(
        "efficient: the lowest clock tried, % of the card's top clock"))] | None = None
    signal: Literal["auto", "progress", "memory"] | None = Field(None, description=(
        "efficient: the throughput signal (auto: the job's progress rate, else memory utilization)"))

    @model_validator(mode="after")
    def _search_keys(self) -> GpuClocksRule:
        keys = [k for k in ("max_slowdown_pct", "step_pct", "measure_s", "floor_pct", "signal")
                if getattr(self, k) is not None]
        if keys and self.max_mhz != "efficient":
            raise ValueError(f"{', '.join(keys)} only go with max_mhz: efficient")
        return self

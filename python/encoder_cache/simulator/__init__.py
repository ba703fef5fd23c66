"""Replay generated multimodal serving traffic through a vLLM-like scheduler
to compare encoder-cache managers: encoder work saved or wasted, and the CPU
time the bookkeeping costs. ``python -m encoder_cache simulate`` runs it."""

from encoder_cache.simulator.scheduler import (
    BEHAVIOURS,
    IMPLEMENTATIONS,
    Counters,
    RunResult,
    SchedulerLimits,
    SimulationError,
    simulate,
)
from encoder_cache.simulator.workloads import KINDS, Workload, WorkloadConfig, generate

__all__ = [
    "BEHAVIOURS",
    "IMPLEMENTATIONS",
    "KINDS",
    "Counters",
    "RunResult",
    "SchedulerLimits",
    "SimulationError",
    "Workload",
    "WorkloadConfig",
    "generate",
    "simulate",
]

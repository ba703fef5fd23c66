"""Replay multimodal serving traffic (generated, or an operator's trace)
through a vLLM-like scheduler to compare encoder-cache policies and sizes:
encoder work, its GPU time, and the bookkeeping's CPU time.
``python -m encoder_cache simulate`` runs it; docs/simulator.md explains it."""

from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.scheduler import (
    BEHAVIOURS,
    IMPLEMENTATIONS,
    UNBOUNDED,
    Counters,
    RunResult,
    SchedulerLimits,
    SimulationError,
    Variant,
    available_policies,
    simulate,
)
from encoder_cache.simulator.trace import TraceError, TraceWorkload, write_trace
from encoder_cache.simulator.workloads import KINDS, Workload, WorkloadConfig, generate

__all__ = [
    "BEHAVIOURS",
    "IMPLEMENTATIONS",
    "KINDS",
    "UNBOUNDED",
    "Counters",
    "EncoderCost",
    "RunResult",
    "SchedulerLimits",
    "SimulationError",
    "TraceError",
    "TraceWorkload",
    "Variant",
    "Workload",
    "WorkloadConfig",
    "available_policies",
    "generate",
    "simulate",
    "write_trace",
]

"""Replay multimodal serving traffic (generated, or an operator's trace)
through a vLLM-like scheduler to compare encoder-cache policies and sizes:
encoder work, its GPU time, and the bookkeeping's CPU time.
``python -m encoder_cache simulate`` runs it; docs/simulator.md explains it.

The modules, each one thing:

- ``spec``: what a request is (``RequestSpec``, its prompt's segments);
  ``workloads``: the built-in traffic generators; ``trace``: an operator's
  traffic as JSON lines.
- ``prompts``: a request's token identity (runs of content) and its concrete
  token ids (``materialize``), the same for every engine.
- ``arrivals``: when each request reaches the waiting queue (open loop, or a
  session turn after its think time); any engine can drive it.
- ``variants``: the manager configurations compared (policy, lookahead,
  implementation, behaviour) and the factory of their managers.
- ``limits``: the scheduler's limits and the encoder budget vLLM derives.
- ``engine``: the built-in model of vLLM's scheduler, the run loop
  (``simulate``); ``inflight``: its requests in flight and scheduled steps;
  ``prefix_cache``: its KV block pool; ``checks``: the invariants
  ``check=True`` verifies; ``oracle``: Belady's rule.
- ``vllm_engine``: the same runs through vLLM 0.33's own scheduler
  (``--engine vllm``).
- ``ledger``: what each item occurrence cost, counted the same way by every
  engine; ``results``: what a run reports (``Counters``, ``RunResult``),
  whichever engine ran it; ``cost``: the encoder time model.
- ``host_tier``: the host-memory tier (``HostBlockCache`` as vLLM's CPU
  connector drives it); ``host_search``: its runs, table and recommendation.
- ``routers``, ``cluster``: several replicas behind a router;
  ``routing_cli``, ``routing_report``: the routing table.
- ``report``: tables, recommendation and JSON from the runs; ``plot``;
  ``sweep``: which runs an invocation makes, through any engine.
- ``options``, ``progress``, ``cli``: the command line.
"""

from encoder_cache.simulator.arrivals import Arrivals
from encoder_cache.simulator.cost import EncoderCost
from encoder_cache.simulator.engine import simulate
from encoder_cache.simulator.limits import SchedulerLimits
from encoder_cache.simulator.results import Counters, RunResult, SimulationError
from encoder_cache.simulator.trace import TraceError, TraceWorkload, write_trace
from encoder_cache.simulator.variants import BEHAVIOURS, IMPLEMENTATIONS, UNBOUNDED, Variant, available_policies
from encoder_cache.simulator.workloads import KINDS, Workload, WorkloadConfig, generate

__all__ = [
    "BEHAVIOURS",
    "IMPLEMENTATIONS",
    "KINDS",
    "UNBOUNDED",
    "Arrivals",
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

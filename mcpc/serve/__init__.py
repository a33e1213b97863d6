"""The serving simulator: a workload of requests served by one NPU over virtual time, with step
costs from the compiled program's timing model (``docs/serving.md``)."""

from .cost import AnalyticCost, CostGrid, ExactCost, ServedShape, StepCost, load_cost_file
from .engine import Iteration, Seq, Simulator
from .kv import ServingKV
from .metrics import chrome_trace, summarize
from .policies import POLICIES, load_policy, make_policy
from .workload import Request, WorkloadSpec, generate, load_workload

__all__ = [
    "POLICIES",
    "AnalyticCost",
    "CostGrid",
    "ExactCost",
    "Iteration",
    "Request",
    "Seq",
    "ServedShape",
    "ServingKV",
    "Simulator",
    "StepCost",
    "WorkloadSpec",
    "chrome_trace",
    "generate",
    "load_cost_file",
    "load_policy",
    "load_workload",
    "make_policy",
    "summarize",
]

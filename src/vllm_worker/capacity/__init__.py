"""Will this model fit this GPU under vLLM 0.32? The capacity plan, one import away.

The plan lives in modules named for what they decide; this face holds the names the rest
of the worker uses; everything else is imported from its module:

- `model_facts`: what a model is, read from config.json and safetensors headers;
- `plan_settings`: the worker's variables resolved to what vLLM will run with;
- `kv_cache`: how vLLM turns KV memory into blocks, tokens and a longest context (exact);
- `budget_versions`: where a vLLM version budgets differently from 0.32;
- `memory_budget`: vLLM 0.32's memory budget term by term, and the plan;
- `plan_report`: the table, the JSON and the log line (`vllm-worker plan`);
- `first_launch`: what to launch first, and the answer when nothing fits;
- `measured`: the engine's real figures against the plan, once it is ready (`ready_engine_report`,
  called by `main`).
"""

from __future__ import annotations

from vllm_worker.capacity.first_launch import StartupPlan, startup_plan
from vllm_worker.capacity.measured import (
    EngineCapacity,
    capacity_report,
    compared_terms,
    parse_cache_config_metric,
    parse_engine_capacity,
    ready_engine_report,
)
from vllm_worker.capacity.memory_budget import Plan, plan
from vllm_worker.capacity.model_facts import (
    CapacityError,
    GiB,
    MiB,
    ModelFacts,
    facts_from_cache,
    facts_from_config,
    facts_from_folder,
    facts_from_hub,
)
from vllm_worker.capacity.plan_report import plan_cli
from vllm_worker.capacity.plan_settings import Knobs, knobs_from_env

__all__ = [
    "CapacityError", "EngineCapacity", "GiB", "Knobs", "MiB", "ModelFacts", "Plan", "StartupPlan",
    "capacity_report", "compared_terms", "facts_from_cache", "facts_from_config", "facts_from_folder",
    "facts_from_hub", "knobs_from_env", "parse_cache_config_metric", "parse_engine_capacity", "plan",
    "plan_cli", "ready_engine_report", "startup_plan",
]

"""The plan as people read it: the table and JSON of `vllm-worker plan`, and the worker's log line.

Whatever the form, the plan says one longest context that fits: the conservative end
of its error band (`Plan.longest_context`). The table shows it with the band beside it,
the JSON carries it as `max_model_len` (`max_model_len_low`/`_high` are the band), and a
suggested MAX_MODEL_LEN is that same number, so the three never disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from vllm_worker.capacity.gpus import find_card
from vllm_worker.capacity.kv_cache import kv_dtype_bytes
from vllm_worker.capacity.memory_budget import VERDICT_TEXT, Plan, fmt_gib, fmt_tokens, plan
from vllm_worker.capacity.model_facts import CapacityError, GiB, ModelFacts, facts_from_cache, facts_from_folder, facts_from_hub
from vllm_worker.capacity.plan_settings import knobs_for, parse_size
from vllm_worker.config.profile import DEFAULT_GPU_MEMORY_UTILIZATION, LaunchProfile
from vllm_worker.model.preflight import Target, classify_hub_error, failure_message

CLI_DEFAULT_GPU_BYTES = 24 * GiB


def context_text(p: Plan) -> str:
    """'111,360 tokens (band 111,360 to 128,224)': the stated context with its error band."""
    if p.max_model_len_high == p.longest_context:
        return f"{fmt_tokens(p.longest_context)} tokens"
    return (f"{fmt_tokens(p.longest_context)} tokens, {p.longest_context_basis} (error band "
            f"{fmt_tokens(p.longest_context)} to {fmt_tokens(p.max_model_len_high)})")


def kv_band_text(p: Plan) -> str:
    """'10.6 to 13.5 GiB by the error band' (exact plans: 'set explicitly')."""
    if p.kv_exact:
        return "set explicitly"
    low = p.kv_cache_bytes - p.conservative_margin_bytes
    return f"{fmt_gib(max(0, low))} to {fmt_gib(p.kv_cache_bytes + p.margin_bytes)} GiB by the plan's error band"


def summary_line(p: Plan) -> str:
    """The one log line describing a plan."""
    head = f"capacity plan ({VERDICT_TEXT[p.verdict]})"
    if p.kv_exact:
        budget = f"KV cache {fmt_gib(p.kv_cache_bytes)} GiB (set explicitly)"
    else:
        compile_part = ""
        if p.compile_cache == "cold":
            compile_part = f", cold compile {fmt_gib(p.compile_bytes)}"
        elif p.compile_cache == "unknown":
            compile_part = f", up to {fmt_gib(p.compile_bytes)} more on a first boot"
        budget = (
            f"{fmt_gib(p.device_total_bytes)} GiB x {p.utilization:g} = {fmt_gib(p.requested_bytes)} GiB: weights "
            f"{fmt_gib(p.weights_bytes)}, activations {fmt_gib(p.activation_bytes)}, CUDA graphs {fmt_gib(p.cudagraph_bytes)}, "
            f"non-torch {fmt_gib(p.non_torch_bytes)}{compile_part} -> KV cache {fmt_gib(p.kv_cache_bytes)} GiB "
            f"({kv_band_text(p)})"
        )
    return (
        f"{head}: {budget}; {p.kv_bytes_per_token / 1024:.1f} KiB/token -> {fmt_tokens(p.kv_cache_tokens)} tokens, "
        f"{p.max_concurrency:.2f}x at {fmt_tokens(p.max_model_len)} tokens per request; longest context that fits "
        f"{context_text(p)} (MAX_NUM_SEQS={p.max_num_seqs}, MAX_NUM_BATCHED_TOKENS="
        f"{p.max_num_batched_tokens}, {'eager' if p.enforce_eager else 'CUDA graphs'})"
    )


def _verdict_row(p: Plan) -> str:
    if p.verdict == "fits":
        return "fits"
    if p.verdict == "does_not_fit":
        return "DOES NOT FIT"
    return (
        f"too close to call: {fmt_tokens(p.max_model_len)} tokens is inside the plan's error band "
        f"({fmt_tokens(p.longest_context)} to {fmt_tokens(p.max_model_len_high)})"
    )


def render_table(p: Plan, facts: ModelFacts, device_name: str | None, max_concurrency: int) -> str:
    """The plan as a table a person can act on."""
    gpu = f"{device_name} ({fmt_gib(p.device_total_bytes)} GiB)" if device_name else f"{fmt_gib(p.device_total_bytes)} GiB"
    if p.gpus > 1:
        gpu = f"{p.gpus} x {gpu}"
    kv_dtype = f"{p.kv_cache_dtype}, {kv_dtype_bytes(facts, p.kv_cache_dtype)} byte(s) per value"
    attention = "MLA" if facts.mla else f"{facts.num_kv_heads} KV heads x {facts.head_dim}"
    sliding = sum(1 for w in facts.layer_windows if w is not None)
    if sliding:
        attention += f", {sliding}/{facts.num_layers} layers sliding-window"
    graphs = "none (eager)" if p.enforce_eager else f"{fmt_gib(p.cudagraph_bytes)} GiB ({p.graphs} graphs)"
    rows: list[tuple[str, str]] = [
        ("model", f"{facts.source} ({facts.model_type}, {facts.num_layers} layers, {attention})"),
        ("GPU", f"{gpu} x GPU_MEMORY_UTILIZATION {p.utilization:g} = {fmt_gib(p.requested_bytes)} GiB"),
        ("weights", f"{fmt_gib(p.weights_bytes)} GiB per GPU ({p.weights_source})"),
        ("activations",
         f"{fmt_gib(p.activation_bytes)} GiB (MAX_NUM_BATCHED_TOKENS={p.max_num_batched_tokens}, MAX_NUM_SEQS={p.max_num_seqs})"),
        ("CUDA graphs", graphs),
        ("non-torch", f"{fmt_gib(p.non_torch_bytes)} GiB"),
    ]
    if p.compile_cache == "cold":
        rows.append(("cold compile", f"{fmt_gib(p.compile_bytes)} GiB (torch.compile's cache is empty)"))
    elif p.compile_cache == "unknown":
        rows.append(("cold compile", f"up to {fmt_gib(p.compile_bytes)} GiB on a first boot (torch.compile's cache "
                                     f"empty), counted at the conservative end"))
    rows += [
        ("KV cache", f"{fmt_gib(p.kv_cache_bytes)} GiB ({kv_band_text(p)})"),
        ("KV per token", f"{p.kv_bytes_per_token:,} bytes (KV_CACHE_DTYPE={kv_dtype})"),
        ("KV tokens", f"{fmt_tokens(p.kv_cache_tokens)} ({p.num_blocks:,} blocks of {p.block_size})"),
        ("longest context", f"{context_text(p)}; model maximum {fmt_tokens(p.model_max_len)}"),
        ("concurrency", f"{p.max_concurrency:.2f} requests of {fmt_tokens(p.max_model_len)} tokens at once"),
        ("verdict", _verdict_row(p)),
    ]
    for problem in p.problems:
        rows.append(("problem", problem))
    if p.verdict != "fits":
        if p.changes:
            rows.append(("smallest change", f"{p.changes[0].flag} {p.changes[0].value} ({p.changes[0].effect})"))
            for change in p.changes[1:]:
                rows.append(("or", f"{change.flag} {change.value} ({change.effect})"))
        else:
            rows.append(("fix", "no single setting change fits: use a larger GPU or a smaller or quantized checkpoint"))
    elif p.max_concurrency < max_concurrency:
        rows.append(("note", f"fewer than MAX_CONCURRENCY={max_concurrency} full-length requests fit at once"))
    for note in p.notes:
        rows.append(("note", note))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


# =====================================================================================
# CLI: vllm-worker plan MODEL ...
# =====================================================================================


def _cli_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-worker plan",
        description="Predict whether a model fits a GPU under vLLM 0.32, without downloading its weights.",
    )
    p.add_argument("model", help="Hugging Face repo id (HF_TOKEN honoured) or a local model folder")
    p.add_argument("--revision", default=None)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu-memory", help="memory of one GPU, e.g. 24GiB or 80GB (CUDA's total)")
    where.add_argument("--gpu", help="a card name from the table, e.g. 'RTX 4090', 'H100', 'L40S'")
    p.add_argument("--gpus", type=int, default=None, help="GPUs (tensor parallel size when --tensor-parallel-size is not given)")
    p.add_argument("--utilization", type=float, default=None, help=f"GPU_MEMORY_UTILIZATION (default {DEFAULT_GPU_MEMORY_UTILIZATION})")
    p.add_argument("--max-model-len", default=None, help="context length (default: the model's; 'auto' fits what the memory holds)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: the worker's, a multiple of 8 >= --max-concurrency")
    p.add_argument("--max-concurrency", type=int, default=30, help="the worker's MAX_CONCURRENCY (default 30)")
    p.add_argument("--max-num-batched-tokens", default=None)
    p.add_argument("--kv-cache-dtype", default=None, help="auto (default) or fp8")
    p.add_argument("--tensor-parallel-size", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--dtype", default=None)
    p.add_argument("--compile-cache", choices=("unknown", "cold", "warm"), default="unknown",
                   help="vLLM's torch.compile cache: cold (a first boot), warm (filled by an earlier boot) or unknown")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def plan_cli(argv: Sequence[str]) -> int:
    """`vllm-worker plan ...`: print the plan as a table (or JSON); exit 0 fits (or too close to call), 1 does not, 2 error."""
    parser = _cli_parser()
    args = parser.parse_args(list(argv))
    env: dict[str, str] = {}
    device_name: str | None = None
    hub = LaunchProfile.parse(os.environ)
    try:
        if args.gpu:
            card = find_card(args.gpu)
            total: int | None = card.total_bytes
            device_name = card.name
        elif args.gpu_memory:
            total = parse_size(args.gpu_memory)
        else:
            total = CLI_DEFAULT_GPU_BYTES
        tp = args.tensor_parallel_size or args.gpus or 1
        for name, value in (
            ("GPU_MEMORY_UTILIZATION", args.utilization),
            ("MAX_MODEL_LEN", args.max_model_len),
            ("MAX_NUM_SEQS", args.max_num_seqs),
            ("MAX_NUM_BATCHED_TOKENS", args.max_num_batched_tokens),
            ("KV_CACHE_DTYPE", args.kv_cache_dtype),
            ("TENSOR_PARALLEL_SIZE", tp if tp > 1 else None),
            ("DTYPE", args.dtype),
        ):
            if value is not None:
                env[name] = str(value)
        if args.enforce_eager:
            env["ENFORCE_EAGER"] = "true"
        facts = _cli_facts(args.model, args.revision, hub)
        # The worker's MAX_NUM_SEQS default for --max-concurrency, as a worker configured so would pass it.
        profile = replace(LaunchProfile.parse(env), max_concurrency=args.max_concurrency)
        knobs = knobs_for(profile, worker_seqs=True, device_name=device_name)
        knobs = replace(knobs, compile_cache=args.compile_cache)
        result = plan(facts, total, knobs, max_concurrency=args.max_concurrency)
        if not (args.gpu or args.gpu_memory):
            result = replace(result, notes=(*result.notes, "no --gpu or --gpu-memory given: planned for a 24 GiB GPU"))
    except Exception as exc:  # noqa: BLE001 - the CLI reports every failure in one line
        message = _cli_error(exc, args.model, hub.token_set)
        if args.json:
            print(json.dumps({"error": message}))
        else:
            print(f"vllm-worker plan: {message}", file=sys.stderr)
        return 2
    if args.json:
        data = result.to_json()
        data["gpu"] = device_name
        print(json.dumps(data, indent=None, sort_keys=True))
    else:
        print(render_table(result, facts, device_name, args.max_concurrency))
    return 0 if result.verdict != "does_not_fit" else 1


def _cli_facts(model: str, revision: str | None, hub: LaunchProfile) -> ModelFacts:
    """The model's facts from a folder, the local cache (offline) or the Hub, as `hub` (the shell's
    token, endpoint and offline switch) allows."""
    path = Path(model).expanduser()
    if path.is_dir():
        return facts_from_folder(path)
    if hub.offline is not None:
        return facts_from_cache(model, revision)
    return facts_from_hub(model, revision=revision, token=hub.hf_token, endpoint=hub.hf_endpoint)


def _cli_error(exc: BaseException, model: str, token_set: bool) -> str:
    if isinstance(exc, CapacityError):
        return str(exc)
    try:
        kind, definitive = classify_hub_error(exc)
        if definitive:
            text = failure_message(kind, Target(model, None, "MODEL", "--revision"), token_set)
            if text:
                return text
        return f"could not read {model!r} from the Hub ({kind}: {type(exc).__name__})"
    except Exception:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(plan_cli(sys.argv[1:]))

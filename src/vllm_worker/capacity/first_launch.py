"""The capacity plan at startup: what to launch first, and what every job hears when nothing fits.

Before the first launch the worker reads the model's facts (a baked folder's headers, or
config.json plus the safetensors counts the pre-flight already fetched), plans the
configured settings and decides: launch as configured; launch the first profile of the
relaunch ladder predicted to fit (with a loud warning for every explicit setting it
changes); launch with MAX_MODEL_LEN=auto when the context is not set; or answer every job
with the figures and the fixes without launching. `startup_plan` never raises: a plan
that cannot be made lets the boot go on as configured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from vllm_worker.capacity.gpus import CARDS
from vllm_worker.capacity.kv_cache import kv_bytes_per_token
from vllm_worker.capacity.memory_budget import MIN_USEFUL_CONTEXT, Plan, fmt_gib, fmt_tokens, plan, weights_bytes
from vllm_worker.capacity.model_facts import (
    CapacityError,
    GiB,
    ModelFacts,
    facts_from_cache,
    facts_from_config,
    facts_from_folder,
    facts_from_hub,
)
from vllm_worker.capacity.plan_report import summary_line
from vllm_worker.capacity.plan_settings import cpu_has_amx, knobs_for
from vllm_worker.config.profile import LaunchProfile, ProfileChange
from vllm_worker.config.secrets import mask_text
from vllm_worker.diagnosis.verdict import Diagnosis, Tried
from vllm_worker.engine import ladder


@dataclass
class FitDecision:
    """What to launch first: as configured, a ladder profile predicted to fit, or nothing."""

    status: str  # "as_configured" | "profile" | "cannot_fit" | "unknown"
    overrides: dict[str, str | None] = field(default_factory=dict)
    relaunch: Any = None  # ladder.Relaunch for the chosen profile (None when as configured)
    steps: list[Any] = field(default_factory=list)  # the ladder steps that make it, in order (each a step taken)
    not_fitting: list[str] = field(default_factory=list)  # ladder profiles predicted not to fit (for the log)
    plan: Plan | None = None  # the plan of the configuration that will be launched
    configured: Plan | None = None  # the plan as configured
    warnings: list[str] = field(default_factory=list)
    fatal_message: str | None = None


def fit_profile(
    facts: ModelFacts,
    device_total_bytes: int,
    profile: LaunchProfile,
    *,
    device_name: str | None = None,
    fit_context: bool = True,
    compile_cache: str = "unknown",
) -> FitDecision:
    """Choose the first launch (item 3 of the capacity issue).

    As configured when the plan does not say, by more than its margin, that it cannot
    fit; otherwise the first profile of the relaunch ladder (ladder.next_launch on a
    memory shortfall: MAX_NUM_SEQS, then eager) predicted to fit; then, only when
    MAX_MODEL_LEN is not set, MAX_MODEL_LEN=auto (vLLM fits the longest context itself);
    else "cannot_fit" with the figures and the fixes. An explicit MAX_MODEL_LEN is never
    lowered, and every explicit setting a profile changes is named in a warning.
    """
    def plan_for(launch: LaunchProfile) -> Plan:
        knobs = knobs_for(launch, worker_seqs=True, device_name=device_name, compile_cache=compile_cache)
        return plan(facts, device_total_bytes, knobs, max_concurrency=launch.max_concurrency)

    env = profile.env
    configured = plan_for(profile)
    decision = FitDecision(status="as_configured", plan=configured, configured=configured)
    if configured.verdict != "does_not_fit":
        return decision

    # The ladder a startup out-of-memory would climb, walked on predictions instead of launches.
    shortfall = Diagnosis(kind="memory_shortfall", message="predicted", evidence="capacity plan", detail="kv_too_small")
    climb = ladder.Ladder(profile, device_total_bytes=device_total_bytes)
    launch = profile
    candidates: list[tuple[Any, LaunchProfile, Plan]] = []
    steps: dict[int, list[Any]] = {}  # id(step) -> the steps taken up to it
    while True:
        step = climb.after_failure(launch, shortfall)
        if isinstance(step, ladder.Stop):
            break
        launch = climb.profile
        candidate = plan_for(launch)
        candidates.append((step, launch, candidate))
        steps[id(step)] = list(climb.taken)
        if candidate.verdict != "does_not_fit":
            break

    chosen = next(((s, e, p) for s, e, p in candidates if p.verdict == "fits"), None)
    chosen = chosen or next(((s, e, p) for s, e, p in candidates if p.verdict == "too_close_to_call"), None)
    explicit_len = profile.max_model_len is not None
    if chosen is None and fit_context and not explicit_len and not configured.problems:
        base_step = candidates[0][0] if candidates and candidates[0][0].profile.startswith("max_num_seqs") else None
        context_change = ProfileChange(context_auto=True)
        overrides = {**(base_step.overrides if base_step else {}), **context_change.variables()}
        auto = (candidates[0][1] if base_step else profile).changed("context_auto", context_change, overrides)
        auto_plan = plan_for(auto)
        # vLLM fits the context to the memory it measures, so a first boot's compile only shortens it:
        # the central prediction decides, and the warning gives the band.
        if auto_plan.verdict != "does_not_fit" and auto_plan.max_model_len_fits >= min(MIN_USEFUL_CONTEXT, facts.max_context):
            context = ladder.Relaunch(
                overrides=overrides,
                profile="context_auto",
                reason=(
                    f"the model's full context ({facts.max_context} tokens) does not fit and MAX_MODEL_LEN is not set: "
                    f"launching with MAX_MODEL_LEN=auto, vLLM serves the longest context that fits "
                    f"(predicted about {auto_plan.max_model_len} tokens)"
                ),
                tried=Tried({"MAX_MODEL_LEN": "auto"}, how="first_launch"),
                step="context",
                change=context_change,
                warnings=[
                    f"MAX_MODEL_LEN is not set and the model's full {facts.max_context}-token context does not fit "
                    f"on this GPU: launching with MAX_MODEL_LEN=auto (about {auto_plan.max_model_len} tokens predicted, "
                    f"{auto_plan.longest_context} to {auto_plan.max_model_len_high} by the plan's error band); "
                    f"set MAX_MODEL_LEN to choose the context yourself"
                ],
            )
            chosen = (context, auto, auto_plan)
            steps[id(context)] = [base_step, context] if base_step else [context]

    decision.not_fitting = [s.profile for s, _, p in candidates if p.verdict == "does_not_fit"]
    if chosen is None:
        best = max([configured, *(p for _, _, p in candidates)], key=lambda p: p.kv_cache_bytes)
        decision.status = "cannot_fit"
        decision.plan = best
        decision.fatal_message = cannot_fit_message(
            facts, configured, best, profile, device_name=device_name
        )
        return decision
    step, _, chosen_plan = chosen
    decision.status = "profile"
    decision.relaunch = step
    decision.steps = steps[id(step)]
    decision.overrides = ladder.overrides_against(env, step.overrides)
    decision.plan = chosen_plan
    decision.warnings = list(step.warnings)
    for name, value in decision.overrides.items():
        before = profile.written(name)
        if before is not None and value is not None and before != value:
            line = (
                f"{name}={before} is OVERRIDDEN to {value} for the first launch: the capacity plan predicts the "
                f"configuration as set does not fit ({fmt_gib(-configured.surplus_bytes)} GiB short, error margin "
                f"{fmt_gib(configured.margin_bytes)} GiB)"
            )
            if not any(line.split(" is OVERRIDDEN")[0] in w for w in decision.warnings):
                decision.warnings.append(line)
    return decision


def cannot_fit_message(
    facts: ModelFacts,
    configured: Plan,
    best: Plan,
    profile: LaunchProfile,
    *,
    device_name: str | None = None,
) -> str:
    """The one message every job is answered with when nothing is predicted to fit."""
    subject = f"MODEL_NAME={facts.source!r}" if facts.source else "The model"
    device = f"{fmt_gib(configured.device_total_bytes)} GiB GPU"
    if configured.gpus > 1:
        device = f"{configured.gpus} x {fmt_gib(configured.device_total_bytes)} GiB GPUs"
    explicit_len = profile.max_model_len is not None
    weights_only = best.weights_bytes + best.non_torch_bytes + best.activation_bytes >= (best.requested_bytes or 0)
    fixes: list[str]
    if configured.problems:
        cause = f"{subject} cannot start as configured: {configured.problems[0]}"
        fixes = [str(c) for c in configured.changes]
    elif weights_only:
        cause = (
            f"{subject} does not fit on this {device}: its weights alone take {fmt_gib(configured.weights_bytes)} GiB per "
            f"GPU of the {fmt_gib(configured.requested_bytes)} GiB vLLM may use (GPU_MEMORY_UTILIZATION="
            f"{configured.utilization:g}), before any KV cache (predicted before launch)"
        )
        fixes = _hardware_fixes(facts, configured, profile, device_name, explicit_len)
    else:
        where = (
            f"MAX_MODEL_LEN={configured.max_model_len}"
            if explicit_len
            else f"the model's full context of {configured.max_model_len} tokens (MAX_MODEL_LEN is not set)"
        )
        cause = (
            f"{subject} does not fit on this {device} at {where}: one full-length sequence needs "
            f"{fmt_gib(best.needed_bytes)} GiB of KV cache, but only {fmt_gib(max(0, best.kv_cache_bytes))} GiB is left after "
            f"the weights ({fmt_gib(best.weights_bytes)} GiB), activations and CUDA graphs, and neither fewer "
            f"sequences nor eager mode frees enough (predicted before launch, error margin {fmt_gib(best.margin_bytes)} GiB)"
        )
        fixes = [str(c) for c in configured.changes if c.variable not in ("MAX_NUM_SEQS", "ENFORCE_EAGER")]
    if not fixes:
        fixes = ["use a GPU with more memory, more GPUs with TENSOR_PARALLEL_SIZE, or a smaller or quantized checkpoint"]
    return f"{cause}. To fix: {'; or '.join(fixes)}."


def _hardware_fixes(
    facts: ModelFacts,
    configured: Plan,
    profile: LaunchProfile,
    device_name: str | None,
    explicit_len: bool,
) -> list[str]:
    """More GPUs or a larger card that hold the weights and a useful context (MAX_MODEL_LEN=auto when unset)."""
    want = min(MIN_USEFUL_CONTEXT, facts.max_context)
    launches: dict[int | None, LaunchProfile] = {}

    def fits(gpus: int | None, total: int | None) -> Plan | None:
        if gpus not in launches:  # one profile per configuration, whichever card it is planned on
            change = ProfileChange(tensor_parallel_size=gpus, context_auto=not explicit_len)
            launches[gpus] = profile.changed(profile.name, change, change.variables())
        try:
            knobs = knobs_for(launches[gpus], worker_seqs=True, device_name=device_name)
            p = plan(facts, total, knobs, with_changes=False)
        except CapacityError:
            return None
        return p if p.verdict == "fits" and p.max_model_len_low >= want else None

    fixes: list[str] = []
    tp = configured.tensor_parallel_size
    for more in (2, 4, 8, 16):
        if more > tp:
            p = fits(more, configured.device_total_bytes)
            if p is not None:
                fixes.append(
                    f"set TENSOR_PARALLEL_SIZE={more} and run on {more} GPUs like this one (about "
                    f"{fmt_tokens(p.longest_context)} tokens of context fit)"
                )
                break
    for card in sorted(CARDS, key=lambda c: c.total_bytes):
        if card.total_bytes > (configured.device_total_bytes or 0):
            p = fits(None, card.total_bytes)
            if p is not None:
                fixes.append(f"use a GPU with {fmt_gib(card.total_bytes)} GiB or more, such as {card.name}")
                break
    fixes.append("serve a quantized checkpoint of the model (4-bit weights take about a quarter of 16-bit ones)")
    return fixes


@dataclass
class StartupPlan:
    """What `main` needs from the capacity plan before the first launch."""

    status: str  # "as_configured" | "profile" | "cannot_fit" | "unknown"
    log_line: str
    overrides: dict[str, str | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    fatal_message: str | None = None
    predicted: Plan | None = None  # the plan of what will be launched
    relaunch: Any = None  # ladder.Relaunch when a ladder profile was chosen
    first_steps: list[Any] = field(default_factory=list)  # the ladder steps the first launch takes, in order
    facts: ModelFacts | None = None
    device_total_bytes: int | None = None
    device_name: str | None = None
    platform: str = "cuda"

    def predict_for(self, profile: LaunchProfile) -> Plan | None:
        """The plan for another launch configuration (after a relaunch), without reading the model again."""
        if self.facts is None:
            return None
        try:
            knobs = knobs_for(profile, worker_seqs=True, platform=self.platform,
                                   device_name=self.device_name, cpu_amx=self.platform == "cpu" and cpu_has_amx())
            return plan(self.facts, self.device_total_bytes, knobs, with_changes=False)
        except CapacityError:
            return None

    def status_fields(self) -> dict[str, Any]:
        """JSON-safe summary for the status job."""
        p = self.predicted
        out: dict[str, Any] = {"plan": self.status}
        if p is not None:
            out.update(
                predicted_kv_cache_tokens=p.kv_cache_tokens,
                predicted_max_concurrency=round(p.max_concurrency, 2),
                predicted_kv_cache_gib=round(p.kv_cache_bytes / GiB, 2),
                predicted_margin_gib=round(p.margin_bytes / GiB, 2),
                predicted_max_model_len=p.max_model_len,
                predicted_longest_context=p.longest_context,
                predicted_longest_context_high=p.max_model_len_high,
                predicted_verdict=p.verdict,
                weights_gib=round(p.weights_bytes / GiB, 2),
                kv_bytes_per_token=p.kv_bytes_per_token,
            )
        if self.overrides:
            out["plan_overrides"] = dict(self.overrides)
        return out


def startup_plan(
    profile: LaunchProfile,
    device_total_bytes: int | None,
    *,
    device_name: str | None = None,
    platform: str = "cuda",
    safetensors_parameters: Mapping[str, int] | None = None,
    config: Mapping[str, Any] | None = None,
    facts: ModelFacts | None = None,
    timeout: float = 10.0,
    compile_cache: str = "unknown",
) -> StartupPlan:
    """The capacity plan for the configured settings, before the first launch. Never raises.

    `device_total_bytes`: the per-GPU total vLLM multiplies by the utilization
    (gpu_memory.DeviceMemory.total, the smallest of the GPUs used); None where unknown.
    `safetensors_parameters`: the pre-flight's `model_info_summary.safetensors_parameters`
    (run it with expand=["safetensors"]), so the Hub is not asked twice. Anything that
    cannot be read (no network, a missing path, an unsupported architecture) gives
    status "unknown" and a log line that says why: the boot goes on as configured.
    `compile_cache`: "warm" when the start will find torch.compile's cache warm (the worker's mark on
    the volume, engine.compile_cache): the cold-compile term is then left out of the plan.
    """
    max_concurrency = profile.max_concurrency
    try:
        if facts is None:
            facts = _startup_facts(profile, safetensors_parameters, config, timeout)
        if device_total_bytes is None or platform == "cpu":
            knobs = knobs_for(profile, worker_seqs=True, platform=platform, device_name=device_name,
                              cpu_amx=platform == "cpu" and cpu_has_amx(), compile_cache=compile_cache)
            if knobs.kv_cache_memory_bytes is None:
                per_token = kv_bytes_per_token(facts, knobs.tensor_parallel_size, knobs.kv_cache_dtype, knobs.dtype)
                weights, _ = weights_bytes(facts, knobs)
                return StartupPlan(
                    status="unknown",
                    log_line=(
                        f"capacity plan: weights {fmt_gib(weights)} GiB, KV cache {per_token / 1024:.1f} KiB per token; "
                        f"no fit check ({'CPU engine' if platform == 'cpu' else 'GPU memory unknown'})"
                    ),
                )
            predicted = plan(facts, device_total_bytes, knobs, max_concurrency=max_concurrency)
            return StartupPlan(status="as_configured", log_line=summary_line(predicted), predicted=predicted,
                               warnings=_concurrency_warning(predicted, max_concurrency), facts=facts,
                               device_total_bytes=device_total_bytes, device_name=device_name,
                               platform=platform)
        decision = fit_profile(facts, device_total_bytes, profile, device_name=device_name, compile_cache=compile_cache)
    except Exception as exc:  # noqa: BLE001 - a plan must never block the boot
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reason = mask_text(reason, profile.secrets)
        return StartupPlan(status="unknown", log_line=f"capacity plan unavailable ({reason}); launching as configured")
    assert decision.plan is not None
    line = summary_line(decision.plan)
    if decision.status == "profile" and decision.relaunch is not None:
        line += f"; first launch on profile {decision.relaunch.profile}: {decision.relaunch.reason}"
    elif decision.status == "cannot_fit":
        line += "; nothing predicted to fit, not launching"
    if decision.not_fitting:
        line += f" (predicted not to fit: {', '.join(decision.not_fitting)})"
    warnings = list(decision.warnings)
    if decision.status != "cannot_fit":
        warnings += _concurrency_warning(decision.plan, max_concurrency)
    return StartupPlan(
        status=decision.status,
        log_line=line,
        overrides=decision.overrides,
        warnings=warnings,
        fatal_message=decision.fatal_message,
        predicted=decision.plan,
        relaunch=decision.relaunch,
        first_steps=decision.steps,
        facts=facts,
        device_total_bytes=device_total_bytes,
        device_name=device_name,
        platform=platform,
    )


def _concurrency_warning(p: Plan, max_concurrency: int) -> list[str]:
    if p.verdict == "does_not_fit" or p.max_concurrency >= max_concurrency:
        return []
    return [
        f"predicted: the KV cache holds {p.max_concurrency:.2f} requests of MAX_MODEL_LEN={p.max_model_len} tokens at once, "
        f"fewer than MAX_CONCURRENCY={max_concurrency}; long requests will queue (lower MAX_MODEL_LEN or use more GPU memory)"
    ]


def _startup_facts(
    profile: LaunchProfile,
    safetensors_parameters: Mapping[str, int] | None,
    config: Mapping[str, Any] | None,
    timeout: float,
) -> ModelFacts:
    baked = profile.baked_model_path
    model = profile.served_model
    if model is None:
        raise CapacityError("MODEL_NAME is not set")
    source = profile.model or model
    if config is not None:
        return facts_from_config(config, safetensors_parameters, source=source)
    if baked or model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().is_dir():
        return replace(facts_from_folder(model), source=source)
    if "://" in model:
        raise CapacityError(f"{model} is not a Hub repository or a local folder")
    if profile.offline is not None:
        # HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE: nothing of the start asks the Hub.
        return facts_from_cache(model, profile.revision)
    return facts_from_hub(
        model,
        revision=profile.revision,
        token=profile.hf_token,
        endpoint=profile.hf_endpoint,
        timeout=timeout,
        param_counts=safetensors_parameters,
    )

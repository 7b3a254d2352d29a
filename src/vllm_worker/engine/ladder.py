"""What to launch next after a failed start: the relaunch ladder.

A restart on the same footprint fails the same way, and a user who is told
"lower MAX_NUM_SEQS" after a crash loop has already lost the endpoint. Some
failures have a relaunch that can genuinely succeed, so the worker tries it
itself, within a hard budget of three launches in all:

- a revision that vanished (vLLM pins a commit; a force-push removes it): one
  relaunch without MODEL_REVISION / TOKENIZER_REVISION / CODE_REVISION;
- a memory shortfall, in two steps, each used at most once. Step 1 keeps CUDA
  graphs and lowers MAX_NUM_SEQS to the smallest multiple of 8 >= MAX_CONCURRENCY
  (a field measurement found most of the failing band fits there at full speed);
  step 2 disables graphs (ENFORCE_EAGER=true) and caps MAX_NUM_BATCHED_TOKENS at
  8192, at a real cost in speed on small models. The cap lowers only a larger value:
  unset (or 0), vLLM's own default is 2048 on most cards and 8192 on 70 GiB ones, so
  setting 8192 would raise the activation memory; only on cards of 160 GiB or more
  (default 16384, vLLM 0.32 engine/arg_utils.py) is an unset value capped, and only
  when the caller says how big the card is. Each knob is relaxed only when the user's
  value is looser: a tighter value is kept, an explicit ENFORCE_EAGER=false is
  overridden with a loud warning. A step that would change nothing is skipped, and
  when neither can, there is no relaunch. A KV cache too small for the context while
  its size is fixed (KV_CACHE_MEMORY_BYTES, or VLLM_CPU_KVCACHE_SPACE on the CPU
  engine) is not relaunched: vLLM uses that size whatever the batch or graphs, so
  only the user can change it. MAX_MODEL_LEN is never lowered: it is the user's
  contract with their clients, so the message tells them the length that fits instead;
- memory held by another process, or a profiling race with one: the model and its
  settings are fine, so one relaunch of the same configuration after waiting for
  the memory, never a smaller footprint;
- a fault that may be the host's (NCCL, the CUDA driver, ECC, no GPU visible) or a Hub
  that could not be reached: one relaunch of the same configuration, then the answer,
  which tells the user how to get a fresh machine.

`next_launch` is pure: it reads what happened so far and returns the next step (its
typed `ProfileChange` and the same as overrides) or `Stop`. It derives which steps were used by replaying
itself over the earlier attempts. `Ladder` is the one driver around it: startup walks it
after each failed launch, the monitor asks it for the next memory step after an
out-of-memory death (so a step startup took is not taken twice), and the capacity plan
walks a throwaway one to find the first profile predicted to fit. What it took is kept as
data (`Tried`: which knobs changed to what); only the messages turn it into words.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from vllm_worker.config.profile import LaunchProfile, ProfileChange
from vllm_worker.diagnosis.verdict import EAGER_MAX_BATCHED_TOKENS, TRANSIENT_KINDS, Diagnosis, Tried, changes_text

MAX_LAUNCHES = 3
REVISION_VARIABLES = ("MODEL_REVISION", "REVISION", "TOKENIZER_REVISION", "CODE_REVISION")
# From this device size vLLM 0.32's default max_num_batched_tokens for the OpenAI server is
# 16384, above the eager step's cap (engine/arg_utils.py, _set_default_max_num_seqs_and_batched_tokens_args).
LARGEST_DEFAULT_BATCH_FROM_BYTES = 160 * 2**30
# KV shortfalls whose only cause is the KV cache's size: a fixed size makes them unfixable by a relaunch.
_KV_SIZE_DETAILS = ("kv_too_small", "no_kv_memory", "auto_fit")

# Memory shortfalls that no batch or graph setting can help.
_NOT_FOOTPRINT_FIXABLE = {
    "weights_load": "the weights alone do not fit; fewer sequences or eager mode cannot shrink them",
    "cpu_kv_explicit": "the KV cache size was set explicitly; the worker does not change it",
}


@dataclass(frozen=True)
class Attempt:
    """One launch: the environment it ran with and what its failure was diagnosed as."""

    env: Mapping[str, str]
    diagnosis: Diagnosis | None

    @property
    def profile(self) -> LaunchProfile:
        """The launch's configuration as typed knobs (parsed in one place, `profile`)."""
        return LaunchProfile.parse(self.env)


@dataclass(frozen=True)
class Relaunch:
    """Launch again with `change` made to the profile that failed.

    change: what this step changes, typed (`LaunchProfile.changed` makes it; none: the same again).
    overrides: the same as the variables a user would write, variable -> value, None = removed;
    cumulative (they include earlier relaunches' overrides): the record every response names.
    profile: "max_num_seqs=N", "eager", "revision_unpinned" or "same".
    tried: what this relaunch changed, as data (a later failure's message names it). warnings:
    lines to log loudly. wait_for_memory: wait for device memory to be released first.
    """

    overrides: dict[str, str | None]
    profile: str
    reason: str
    tried: Tried
    warnings: list[str] = field(default_factory=list)
    wait_for_memory: bool = False
    step: str = ""  # the ladder's step: "revision", "seqs", "eager", "held", "race", "transient", "context"; each once
    change: ProfileChange = ProfileChange()

    @property
    def tried_phrase(self) -> str:
        return self.tried.phrase


@dataclass(frozen=True)
class Stop:
    """No relaunch: answer jobs with the diagnosis."""

    reason: str


# Causes answered by one launch of the same configuration, after waiting for the memory:
# kind -> (step name, used once; why not again; reason; how the messages name it).
_SAME_AGAIN: dict[str, tuple[str, str, str, str]] = {
    "memory_held": (
        "held",
        "the memory was still held after waiting once",
        "another process held the memory vLLM needs; waiting for it and launching the same configuration",
        "after_wait",
    ),
    "profiling_race": (
        "race",
        "the memory measurement was disturbed again",
        "another process changed GPU memory while vLLM measured it; launching the same configuration",
        "same",
    ),
    "transient": (
        "transient",
        "{kind}: it failed the same way after one relaunch",
        "{kind}: a fault that may pass; launching the same configuration once more",
        "same",
    ),
}


def next_launch(
    base_env: Mapping[str, str],
    attempts: Sequence[Attempt],
    max_launches: int = MAX_LAUNCHES,
    *,
    device_total_bytes: int | None = None,
) -> Relaunch | Stop:
    """The next launch after `attempts` (all failed, oldest first, the first as configured), or Stop:
    `Ladder` driven over them, for a caller that has the launches but no ladder."""
    if not attempts:
        raise ValueError("next_launch needs at least one failed attempt")
    climb = Ladder(LaunchProfile.parse(base_env), device_total_bytes=device_total_bytes, max_launches=max_launches)
    step: Relaunch | Stop = Stop("no attempt")
    for attempt in attempts:
        step = climb.after_failure(attempt.profile, attempt.diagnosis)
    return step


def overrides_against(base_env: Mapping[str, str], overrides: Mapping[str, str | None]) -> dict[str, str | None]:
    """Only what differs from the user's configuration is an override (a value set, or a variable removed)."""
    return {
        name: value
        for name, value in overrides.items()
        if (name in base_env if value is None else base_env.get(name) != value)
    }


def _plan(
    profile: LaunchProfile,
    diagnosis: Diagnosis | None,
    launches: int,
    taken: Sequence[Relaunch],
    prior: Mapping[str, str | None],
    max_launches: int,
    device_total_bytes: int | None,
) -> Relaunch | Stop:
    """The step after `profile` failed with `diagnosis`, its `launches`-th launch, given the steps `taken`."""
    if launches >= max_launches:
        return Stop(f"already launched {launches} times, the most the worker makes")
    if diagnosis is None:
        return Stop("the failure was not recognised, so no relaunch is known to help")
    used = {step.step for step in taken}
    prior = dict(prior)

    if diagnosis.kind == "revision_not_found":
        if "revision" in used:
            return Stop("the revision was already unpinned once")
        return _revision_step(profile, prior)
    same_again = _SAME_AGAIN.get("transient" if diagnosis.kind in TRANSIENT_KINDS else diagnosis.kind)
    if same_again is not None:
        name, stop, reason, how = same_again
        if name in used:
            return Stop(stop.format(kind=diagnosis.kind))
        return Relaunch(
            prior, "same", reason.format(kind=diagnosis.kind), Tried(how=how), wait_for_memory=True, step=name
        )
    if diagnosis.kind == "memory_shortfall":
        if diagnosis.detail in _NOT_FOOTPRINT_FIXABLE:
            return Stop(_NOT_FOOTPRINT_FIXABLE[diagnosis.detail])
        if diagnosis.detail in _KV_SIZE_DETAILS:
            kv = profile.kv_cache_for(cpu=diagnosis.facts.get("device") == "CPU")
            fixed_by = kv.variable if kv is not None else diagnosis.facts.get("kv_cache_variable")
            if fixed_by:
                return Stop(f"the KV cache size is fixed by {fixed_by}; fewer sequences or eager mode cannot make it hold more")
        seqs = _seqs_step(profile, prior) if "seqs" not in used else None
        if seqs is not None:
            return seqs
        eager = _eager_step(profile, prior, device_total_bytes) if "eager" not in used else None
        if eager is not None:
            return eager
        return Stop("every memory relaunch step was used or would change nothing")
    return Stop(f"{diagnosis.kind}: a relaunch cannot fix this")


def _revision_step(profile: LaunchProfile, prior: dict[str, str | None]) -> Relaunch:
    pinned = [name for name in REVISION_VARIABLES if profile.written(name) is not None]
    change = ProfileChange(unpinned=tuple(pinned))
    overrides = {**prior, **change.variables()}
    if pinned:
        names = ", ".join(pinned)
        warnings = [
            f"{name}={profile.written(name)!r} no longer exists on the Hub; relaunching without it, "
            f"so the repository's default branch is served"
            for name in pinned
        ]
        tried = Tried({name: None for name in pinned})
        reason = f"the pinned revision vanished; relaunching without {names}"
    else:
        warnings = []
        tried = Tried(how="refetch")
        reason = "the revision vLLM resolved vanished during the download; relaunching to resolve it again"
    return Relaunch(overrides, "revision_unpinned", reason, tried, warnings=warnings, step="revision", change=change)


def _seqs_step(profile: LaunchProfile, prior: dict[str, str | None]) -> Relaunch | None:
    target = profile.worker_max_num_seqs
    current = profile.effective_max_num_seqs()
    if current <= target or "max-num-seqs" in profile.extra_args_flags:
        return None
    change = ProfileChange(max_num_seqs=target)
    return Relaunch(
        overrides={**prior, **change.variables()},
        profile=f"max_num_seqs={target}",
        reason=(
            f"out of memory with MAX_NUM_SEQS={current}; relaunching with MAX_NUM_SEQS={target} "
            f"(enough for MAX_CONCURRENCY={profile.max_concurrency}), CUDA graphs kept"
        ),
        tried=Tried(change.variables()),
        step="seqs",
        change=change,
    )


def _eager_step(profile: LaunchProfile, prior: dict[str, str | None], device_total_bytes: int | None) -> Relaunch | None:
    extra = profile.extra_args_flags
    change = ProfileChange()
    warnings: list[str] = []
    eager = profile.enforce_eager
    if eager is not True and not extra & {"enforce-eager", "no-enforce-eager"}:
        change = replace(change, enforce_eager=True)
        if eager is False:
            warnings.append(
                "ENFORCE_EAGER=false is OVERRIDDEN to true for this relaunch: the configuration does not fit "
                "in memory with CUDA graphs; replies will be slower"
            )
    tokens = profile.max_num_batched_tokens  # 0 counts as unset
    if "max-num-batched-tokens" not in extra:
        if tokens is not None:
            cap = tokens > EAGER_MAX_BATCHED_TOKENS
        else:
            # Unset, vLLM picks 2048 or 8192 unless the card has 160 GiB or more.
            cap = device_total_bytes is not None and device_total_bytes >= LARGEST_DEFAULT_BATCH_FROM_BYTES
        if cap:
            change = replace(change, max_num_batched_tokens=EAGER_MAX_BATCHED_TOKENS)
    delta = change.variables()
    if not delta:
        return None
    changed = changes_text(delta)
    note = ""
    if "MAX_NUM_BATCHED_TOKENS" not in delta:
        note = f" (MAX_NUM_BATCHED_TOKENS={tokens} kept)" if tokens is not None else " (MAX_NUM_BATCHED_TOKENS left to vLLM's default)"
    return Relaunch(
        overrides={**prior, **delta},
        profile="eager",
        reason=f"out of memory; relaunching with {changed}{note}: less memory, slower replies",
        tried=Tried(dict(delta)),
        warnings=warnings,
        step="eager",
        change=change,
    )


# --- restarts of an engine that died while serving ------------------------------------------

# An engine that served and then died is restarted in place with the same configuration, but
# a configuration that keeps killing it must not restart forever: past this many restarts in
# the window, jobs are answered with the cause instead.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 1800.0


def restart_allowed(
    restarts: Sequence[float],
    now: float,
    max_restarts: int = MAX_RESTARTS,
    window_s: float = RESTART_WINDOW_S,
) -> bool:
    """Whether one more in-place restart fits the budget.

    restarts: when the earlier restarts happened (any clock, the same as `now`). Those older
    than `window_s` no longer count, so a worker that dies once a day restarts every time.
    """
    recent = [at for at in restarts if now - at < window_s]
    return len(recent) < max_restarts


def restart_budget_phrase(max_restarts: int = MAX_RESTARTS, window_s: float = RESTART_WINDOW_S) -> str:
    """How messages name the budget: "3 restarts within 30 minutes"."""
    minutes = window_s / 60
    return f"{max_restarts} restart{'s' if max_restarts != 1 else ''} within {minutes:g} minutes"


@dataclass(frozen=True)
class Launch:
    """One failed launch of a ladder: the profile launched, the step that made it (None: as
    configured) and what its failure was diagnosed as (None: not recognised)."""

    profile: LaunchProfile
    step: Relaunch | None
    diagnosis: Diagnosis | None


class Ladder:
    """The one ladder driver: where a worker's launches stand, for startup, restarts and the plan.

    base: the user's configuration. `start_on` takes the capacity plan's first steps (steps
    taken like any other: in `taken`, in `tried`, never taken again). After each failed launch
    `after_failure` says what to launch next (or Stop); after an out-of-memory death `after_death`
    gives the next memory step from the profile that was serving. `tried` is what the worker did
    on its own, as data, for the messages; `step` is the relaunch in force (None: as configured)
    and `profile` its launch configuration, made when the step changes.
    """

    def __init__(
        self,
        base: LaunchProfile,
        *,
        device_total_bytes: int | None = None,
        max_launches: int = MAX_LAUNCHES,
        memory_wait: bool = True,
    ) -> None:
        self.base = base
        self.device_total_bytes = device_total_bytes
        self.max_launches = max_launches
        self.memory_wait = memory_wait
        self.launches: list[Launch] = []  # the failed launches, oldest first
        self.taken: list[Relaunch] = []  # every step taken, the plan's first ones included
        self.tried: list[Tried] = []
        self.step: Relaunch | None = None
        self.profile: LaunchProfile = base

    def start_on(self, steps: Relaunch | Sequence[Relaunch] | None) -> LaunchProfile:
        """The first launch: as configured, or on the profile the capacity plan chose (its steps, in order)."""
        chosen = [steps] if isinstance(steps, Relaunch) else list(steps or ())
        for step in chosen:
            self._take(replace(step, tried=replace(step.tried, how="first_launch")) if step.tried.how == "changed" else step)
        return self.profile

    def after_failure(self, profile: LaunchProfile, diagnosis: Diagnosis | None) -> Relaunch | Stop:
        """`profile` failed to start with `diagnosis`: the next launch, or Stop."""
        self.launches.append(Launch(profile, self.step, diagnosis))
        prior = self.step.overrides if self.step is not None else {}
        step = _plan(
            profile, diagnosis, len(self.launches), self.taken, prior, self.max_launches, self.device_total_bytes,
        )
        if isinstance(step, Stop):
            return step
        step = replace(step, overrides=overrides_against(self.base.env, step.overrides))
        # The context length is the user's promise to their clients: never changed behind their back.
        assert "MAX_MODEL_LEN" not in step.overrides or "MAX_MODEL_LEN" in prior
        self._take(step)
        return step

    def after_death(self, diagnosis: Diagnosis) -> Relaunch | None:
        """A serving engine died: after a GPU out-of-memory death the next memory step, else None (the same again)."""
        if diagnosis.kind != "runtime_oom" or diagnosis.facts.get("device") == "CPU":
            return None
        prior = dict(self.step.overrides) if self.step is not None else {}
        serving = self.profile
        step = _seqs_step(serving, prior) or _eager_step(serving, prior, self.device_total_bytes)
        if step is None:
            return None
        step = replace(step, overrides=overrides_against(self.base.env, step.overrides))
        self._take(step)
        return step

    def _take(self, step: Relaunch) -> None:
        self.taken.append(step)
        if step.wait_for_memory and not self.memory_wait:
            self.tried.append(Tried(how="no_wait"))
        else:
            self.tried.append(step.tried)
        if step.profile != "same":
            self.step = step
            self.profile = self.profile.changed(step.profile, step.change, step.overrides)

    def notice(self) -> dict[str, object] | None:
        """The degraded profile every response names (the handler's `worker` object); None as configured."""
        if self.step is None:
            return None
        return {
            "name": self.step.profile,
            "reason": self.step.reason,
            "overrides": dict(self.step.overrides),
            "tried": [t.phrase for t in self.tried],
        }

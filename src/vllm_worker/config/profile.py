"""The launch configuration, parsed once into one layer of typed values; a ladder step a typed change of it.

`LaunchProfile.parse` is the only reader of the strings. `fold` reads the variables once (vLLM's
other spellings, the legacy names, the official worker's speculative variables, with the
conflict check `args_builder.resolve` makes, and VLLM_EXTRA_ARGS's words); `parse` reads every
knob the worker decides on into a typed field ("0 means unset", "true/1/yes/on", "8k", "a flag in
VLLM_EXTRA_ARGS wins" decided here), each of vLLM's options a variable sets into an `Option`, and
keeps the first value it cannot use as `refusal`, the one sentence every job is answered with.
The pre-flight and the model cache, the capacity plan, the memory wait, the ladder, the messages
of `diagnosis` and the restarts of `monitor` read these fields; `command.build_args` renders them
into `vllm serve`'s argv. A ladder step is a `ProfileChange`, made by `LaunchProfile.changed`
without parsing anything again. A message that quotes what the user wrote reads `written(NAME)`,
never to decide on it (tests/unit/test_structure.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence, TypeVar

from vllm_worker.config import args_builder, flag_messages, official_worker
from vllm_worker.config import env as envs
from vllm_worker.config.args_builder import ALIASES, FLAGS, LEGACY_ALIASES, LONG_ALIASES, OPTIONS, SHORT_OPTIONS
from vllm_worker.config.env import Reader, RefusedValue, parse_human_int
from vllm_worker.config.secrets import mask_text, secret_values
from vllm_worker.config.settings import SettingsError, multiple_of_8_at_least, read_setting, whole_in

DEFAULT_MAX_CONCURRENCY = 30
MAX_CONCURRENCY_ACCEPTED = "a whole number from 1 to 4096"
EXTRA_ARGS_NAME = envs.EXTRA_ARGS
CPU_KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# vLLM 0.32's default --gpu-memory-utilization (vllm/config/cache.py).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
# No card has more free than its total less the CUDA context once CUDA is initialised: the largest
# card the capacity plan knows (B200, 182,909 MiB CUDA total, capacity.gpus) less the smallest
# context (256 MiB: capacity.memory_budget's 512 MiB less its 256 MiB error). vLLM checks
# free >= utilization x total before it loads anything, so a utilization at or above this share
# fails on every card, idle or not (a test ties both figures to capacity's).
LARGEST_CARD_MIB = 182909
SMALLEST_CUDA_CONTEXT_MIB = 256
UTILIZATION_CEILING = round((LARGEST_CARD_MIB - SMALLEST_CUDA_CONTEXT_MIB) / LARGEST_CARD_MIB, 4)
TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
CONFIG_FILE_VARIABLES = ("VLLM_CONFIG_FILE", "MODEL_CONFIG")

env_value = envs.value
T = TypeVar("T")


# --- VLLM_EXTRA_ARGS and vLLM's second spellings, folded once ---------------------------------

_NAME_OF_FLAG = {option["flag"]: name for name, option in OPTIONS.items()}
_SWITCHES = frozenset(name for name, kind in FLAGS.items() if kind in ("pair", "store_true"))


def _extra_args_values(words: list[str]) -> list[tuple[str, str]]:
    """(table name, value) for each flag in VLLM_EXTRA_ARGS vLLM's parser knows, in order."""
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--"):
            flag, eq, inline = word.partition("=")
            flag = "--" + flag[2:].replace("_", "-")
        elif word in SHORT_OPTIONS:
            flag, eq, inline = word, "", ""
        else:
            continue
        negated = flag.startswith("--no-") and "--" + flag[5:] in _NAME_OF_FLAG
        flag = LONG_ALIASES.get(flag, flag)
        flag = SHORT_OPTIONS.get(flag, flag)
        name = _NAME_OF_FLAG.get("--" + flag[5:] if negated else flag)
        if name is None:
            continue
        if name in _SWITCHES:
            found.append((name, "false" if negated else (inline if eq else "true")))
        elif eq:
            found.append((name, inline))
        elif i < len(words):
            found.append((name, words[i]))
            i += 1
    return found


@dataclass(frozen=True)
class Option:
    """One of vLLM's options set by a variable (not VLLM_EXTRA_ARGS): its table name, its value as
    written, the variable that set it, and the value as a sentence may quote it (credentials masked).
    `command.build_args` renders it as vLLM's parser takes it."""

    name: str
    value: str
    source: str
    shown: str


_TABLE_ORDER = {name: i for i, name in enumerate(FLAGS)}


def _in_table_order(options: Iterable[Option]) -> tuple[Option, ...]:
    """Options in the order of vLLM's parser (the argv's), whichever spelling set each."""
    return tuple(sorted(options, key=lambda option: _TABLE_ORDER.get(option.name, len(_TABLE_ORDER))))


@dataclass(frozen=True)
class Folded:
    """The environment read once: what the user wrote (`written`: stripped, blanks left out); every value
    under vLLM's table names (`values`) and the variable that set each (`sources`); the table's options
    from the variables alone (what the argv renders before VLLM_EXTRA_ARGS); VLLM_EXTRA_ARGS as shell
    words (None: unbalanced quotes); the fold's warnings; the environment's own notices (answered official
    variables, look-alike names); the credentials' values; and the refusal when two spellings disagree."""

    written: dict[str, str]
    values: dict[str, str]
    sources: dict[str, str]
    options: tuple[Option, ...]
    extra_words: list[str] | None
    warnings: list[str]
    notices: tuple[str, ...]
    secrets: tuple[str, ...]
    refusal: RefusedValue | None


def fold(env: Mapping[str, str]) -> Folded:
    """The environment folded once (`Folded`).

    Every non-blank variable is kept as written; vLLM's other spellings (REVISION for
    MODEL_REVISION, TOKENIZER for TOKENIZER_NAME, --device-memory-utilization), the legacy
    names and the official worker's speculative variables are folded by `args_builder.resolve`
    (which refuses two spellings that disagree); flags in VLLM_EXTRA_ARGS come last on vLLM's
    command line, so they win.
    """
    written = {name: value for name in env if (value := env_value(env, name)) is not None}
    values = dict(written)
    sources = {name: name for name in values}
    warnings: list[str] = []
    refusal: RefusedValue | None = None
    try:
        resolved, resolved_sources = args_builder.resolve(env, warnings)
    except args_builder.ArgsError as error:
        refusal, resolved, resolved_sources = error, {}, {}
        for alias, name in (*ALIASES.items(), *LEGACY_ALIASES.items()):
            if alias in values and name not in sources:
                values[name], sources[name] = values[alias], alias
    secrets = tuple(secret_values(env))
    options = _in_table_order(
        Option(name, value, resolved_sources[name], mask_text(value, secrets))
        for name, value in resolved.items()
        # The official Hub form writes its defaults: a variable vLLM 0.32 dropped, left there, asks for nothing.
        if not (FLAGS.get(name) == "removed" and official_worker.at_form_default(name, value))
    )
    notices = (*official_worker.notices(env), *args_builder.lookalike_warnings(env))
    values.update(resolved)
    sources.update(resolved_sources)
    extra_words = envs.shell_words(values.get(EXTRA_ARGS_NAME, ""))
    for name, value in _extra_args_values(extra_words or []):
        values[name], sources[name] = value, EXTRA_ARGS_NAME
    return Folded(written, values, sources, options, extra_words, warnings, notices, secrets, refusal)


def canonical(name: str) -> str:
    """The table name of a variable: `MODEL_REVISION` -> `REVISION`."""
    return ALIASES.get(name) or LEGACY_ALIASES.get(name) or name


_GIB = 2**30
_KV_SIZE_FLAGS = ("--kv-cache-memory-bytes", "--kv-cache-memory")


@dataclass(frozen=True)
class KvCacheSize:
    """A KV cache size the user fixed: vLLM uses it as is, so no batch, graph or utilization
    setting changes how many tokens the cache holds.

    variable: KV_CACHE_MEMORY_BYTES, VLLM_EXTRA_ARGS (its --kv-cache-memory-bytes) or, on the CPU
    engine, VLLM_CPU_KVCACHE_SPACE (GiB; vLLM lets it win over the flag). value: as written;
    None when only vLLM's log said the size was explicit. size_bytes: None when unreadable.
    """

    variable: str
    value: str | None
    size_bytes: int | None

    @property
    def setting(self) -> str:
        if self.value is None:
            return self.variable
        if self.variable == EXTRA_ARGS_NAME:
            return f"{self.value} in {EXTRA_ARGS_NAME}"
        return f"{self.variable}={self.value}"

    @property
    def raise_fix(self) -> str:
        if self.variable == EXTRA_ARGS_NAME:
            return f"raise the {self.value} in {EXTRA_ARGS_NAME}"
        now = f" (now {self.value})" if self.value is not None else ""
        return f"raise {self.variable}{now}"


def _parse_bytes(text: str) -> int | None:
    try:
        return parse_human_int(text)
    except ValueError:
        return None


def explicit_kv_cache_size(written: Mapping[str, str], words: Sequence[str], cpu: bool = False) -> KvCacheSize | None:
    """The KV cache size the launch fixed, if any (the last one vLLM reads wins), from what the user wrote
    and VLLM_EXTRA_ARGS's words."""
    if cpu:
        space = written.get(CPU_KV_SPACE)
        if space is not None:
            return KvCacheSize(CPU_KV_SPACE, space, int(space) * _GIB if space.isdigit() else None)
    found: tuple[str, str] | None = None
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag.replace("_", "-") in _KV_SIZE_FLAGS:
            if not eq:
                value = words[i + 1] if i + 1 < len(words) else ""
            found = (flag, value)
    if found is not None:
        return KvCacheSize(EXTRA_ARGS_NAME, f"{found[0]} {found[1]}", _parse_bytes(found[1]))
    size = written.get("KV_CACHE_MEMORY_BYTES")
    if size is not None:
        return KvCacheSize("KV_CACHE_MEMORY_BYTES", size, _parse_bytes(size))
    return None


def apply_overrides(env: Mapping[str, str], overrides: Mapping[str, str | None]) -> dict[str, str]:
    """The launch configuration of a ladder profile: a value sets the variable, None removes it."""
    launch_env = dict(env)
    for key, value in overrides.items():
        if value is None:
            launch_env.pop(key, None)
        else:
            launch_env[key] = value
    return launch_env


def _context(read: Reader) -> int | None:
    """MAX_MODEL_LEN in tokens; -1 for auto (or -1); None when unset, 0 or unreadable."""
    text = read.text("MAX_MODEL_LEN")
    if text is not None and text.lower() in ("auto", "-1"):
        return -1
    return read.whole("MAX_MODEL_LEN", human=True)


def _concurrency(env: Mapping[str, str]) -> tuple[int, RefusedValue | None]:
    """MAX_CONCURRENCY, read once for the whole worker: the jobs it takes at once (serving.intake's bound) and
    the default MAX_NUM_SEQS, by the settings' own rule. A value it cannot use is refused (the default stands in
    until the refusal is answered): a worker that took 0 jobs, or thousands, would never serve or would hide
    them all from the autoscaler."""
    try:
        return read_setting(env, "MAX_CONCURRENCY", DEFAULT_MAX_CONCURRENCY, whole_in(1, 4096), MAX_CONCURRENCY_ACCEPTED), None
    except SettingsError as refused:
        return DEFAULT_MAX_CONCURRENCY, refused


def _utilization_refusal(value: float | None, text: str | None, variable: str | None) -> RefusedValue | None:
    """GPU_MEMORY_UTILIZATION validated once: a number above 0 and below what any card has free."""
    if text is None:
        return None
    shown = variable or "GPU_MEMORY_UTILIZATION"
    option = OPTIONS["GPU_MEMORY_UTILIZATION"]
    accepted = flag_messages.problem(option, [text])  # vLLM's own range: above 0, at most 1
    if accepted is not None:
        message = flag_messages.invalid_value(shown, text, option["flag"], accepted)
        return RefusedValue(shown, text, f"{option['flag']} takes {accepted}", message=message)
    if value is not None and value >= UTILIZATION_CEILING:
        return RefusedValue(
            shown, text, "",
            message=(
                f"{shown}={text!r} is not valid: no GPU has that share of its memory free once CUDA has started "
                f"(its context takes at least {SMALLEST_CUDA_CONTEXT_MIB} MiB, so even a "
                f"{LARGEST_CARD_MIB / 1024:.0f} GiB card has at most {UTILIZATION_CEILING:g} free) and vLLM would "
                f"wait for memory that never frees; set it to 0.95 or lower, or leave it unset for vLLM's "
                f"{DEFAULT_GPU_MEMORY_UTILIZATION:g}."
            ),
        )
    return None


@dataclass(frozen=True)
class LaunchProfile:
    """One launch configuration: `env` (the user's variables with the profile's overrides applied)
    and its typed knobs, read once. name: "as configured" or the ladder step ("max_num_seqs=32", "eager").

    The typed fields are the knobs as vLLM will see them, whichever spelling set them (MODEL_REVISION,
    REVISION or --revision in VLLM_EXTRA_ARGS); `variable(NAME)` names the one the user wrote and
    `written(NAME)` what they wrote there, so a message can tell them what to change. `refusal`: the
    first value the worker refuses before any launch (None when there is none); `unreadable`: knobs
    whose text the typed fields could not read (vLLM's own parser, in `args_builder`, refuses them).
    """

    env: Mapping[str, str] = field(repr=False)  # what the user wrote (a step's variables applied): for `written`
    sources: Mapping[str, str]  # table name -> the variable that set it (VLLM_EXTRA_ARGS when a flag there did)
    options: tuple[Option, ...] = field(repr=False)  # vLLM's options the variables set, rendered before VLLM_EXTRA_ARGS
    fold_warnings: tuple[str, ...]
    notices: tuple[str, ...]  # the environment's own warnings: official variables with no effect, look-alike names
    secrets: tuple[str, ...] = field(repr=False)  # the credentials' values, masked in every sentence that quotes a value
    refusal: RefusedValue | None
    unreadable: Mapping[str, str]
    model: str | None
    baked_model_path: str | None
    revision: str | None
    tokenizer: str | None
    tokenizer_revision: str | None
    hf_token: str | None = field(repr=False)
    hf_endpoint: str | None
    max_concurrency: int  # MAX_CONCURRENCY, the worker's one read of it (a value out of range: the default, and `refusal`)
    max_num_seqs: int | None  # as set (0 and unset are None): the worker then passes its own default
    max_num_batched_tokens: int | None  # as set ("8k" read as vLLM reads it); None: vLLM's default
    max_model_len: str | None  # as written: a number, "8k", "auto" or -1
    context_tokens: int | None  # MAX_MODEL_LEN in tokens; -1: auto; None: the model's full context
    enforce_eager: bool | None
    gpu_memory_utilization: float | None  # as set and valid (see `refusal`); `utilization` has the default
    kv_cache_dtype: str
    dtype: str
    quantization: str | None
    kv_cache_memory_bytes: int | None  # KV_CACHE_MEMORY_BYTES (or its flag in VLLM_EXTRA_ARGS), in bytes
    block_size: int | None
    num_gpu_blocks_override: int | None
    cpu_offload_gb: float | None
    disable_sliding_window: bool
    disable_hybrid_kv_cache_manager: bool
    chunked_prefill: bool  # vLLM's default on
    async_scheduling: bool | None  # None: vLLM's default for the platform
    estimate_cudagraphs: bool  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on unless false
    allow_long_max_model_len: bool  # VLLM_ALLOW_LONG_MAX_MODEL_LEN
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    trust_remote_code: bool | None
    kv_cache: KvCacheSize | None  # the size fixed for a GPU engine
    kv_cache_cpu: KvCacheSize | None  # the size fixed for the CPU engine (VLLM_CPU_KVCACHE_SPACE wins there)
    extra_args_flags: frozenset[str]  # flags given in VLLM_EXTRA_ARGS, without their dashes
    extra_args_words: tuple[str, ...] | None  # VLLM_EXTRA_ARGS as a shell splits it; None: unbalanced quotes
    config_file: str | None  # the variable that passes vLLM a config file, when one does
    offline: str | None  # HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE when one is true
    modelscope: bool  # VLLM_USE_MODELSCOPE: the model comes from ModelScope, not the Hub
    name: str = "as configured"
    overrides: Mapping[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(
        cls,
        env: Mapping[str, str],
        name: str = "as configured",
        overrides: Mapping[str, str | None] | None = None,
    ) -> "LaunchProfile":
        folded = fold(env)
        values, sources = folded.values, folded.sources
        read = Reader(values)
        concurrency, concurrency_refusal = _concurrency(env)
        refusal = folded.refusal or concurrency_refusal
        utilization = read.number("GPU_MEMORY_UTILIZATION")
        raw_extra = values.get(EXTRA_ARGS_NAME)
        # Unbalanced quotes (args_builder refuses them): the words split on blanks, for what they name.
        extra_words = folded.extra_words if folded.extra_words is not None else (raw_extra or "").split()
        kv_cache = explicit_kv_cache_size(folded.written, extra_words)
        kv_cache_cpu = explicit_kv_cache_size(folded.written, extra_words, cpu=True)
        if refusal is None and kv_cache is None:
            refusal = _utilization_refusal(
                utilization, values.get("GPU_MEMORY_UTILIZATION"), sources.get("GPU_MEMORY_UTILIZATION")
            )
        if utilization is not None and not 0 < utilization <= 1:
            utilization = None
        offload = read.number("CPU_OFFLOAD_GB")
        profile = cls(
            env=dict(env),
            sources=sources,
            options=folded.options,
            fold_warnings=tuple(folded.warnings),
            notices=folded.notices,
            secrets=folded.secrets,
            refusal=refusal,
            unreadable=read.unreadable,
            model=values.get("MODEL_NAME"),
            baked_model_path=values.get("BAKED_MODEL_PATH"),
            revision=values.get("REVISION"),
            tokenizer=values.get("TOKENIZER"),
            tokenizer_revision=values.get("TOKENIZER_REVISION"),
            hf_token=next((values[v] for v in TOKEN_VARIABLES if v in values), None),
            hf_endpoint=values.get("HF_ENDPOINT"),
            max_concurrency=concurrency,
            max_num_seqs=read.whole("MAX_NUM_SEQS"),
            max_num_batched_tokens=read.whole("MAX_NUM_BATCHED_TOKENS", human=True),
            max_model_len=values.get("MAX_MODEL_LEN"),
            context_tokens=_context(read),
            enforce_eager=read.switch("ENFORCE_EAGER"),
            gpu_memory_utilization=utilization,
            kv_cache_dtype=values.get("KV_CACHE_DTYPE", "auto").lower(),
            dtype=values.get("DTYPE", "auto").lower(),
            quantization=values.get("QUANTIZATION"),
            kv_cache_memory_bytes=read.whole("KV_CACHE_MEMORY_BYTES", human=True),
            block_size=read.whole("BLOCK_SIZE"),
            num_gpu_blocks_override=read.whole("NUM_GPU_BLOCKS_OVERRIDE"),
            cpu_offload_gb=offload if offload else None,
            disable_sliding_window=read.switch("DISABLE_SLIDING_WINDOW") is True,
            disable_hybrid_kv_cache_manager=read.switch("DISABLE_HYBRID_KV_CACHE_MANAGER") is True,
            chunked_prefill=read.switch("ENABLE_CHUNKED_PREFILL") is not False,
            async_scheduling=read.switch("ASYNC_SCHEDULING"),
            estimate_cudagraphs=read.switch("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS") is not False,
            allow_long_max_model_len=read.switch("VLLM_ALLOW_LONG_MAX_MODEL_LEN") is True,
            tensor_parallel_size=max(read.whole("TENSOR_PARALLEL_SIZE") or 1, 1),
            pipeline_parallel_size=max(read.whole("PIPELINE_PARALLEL_SIZE") or 1, 1),
            data_parallel_size=max(read.whole("DATA_PARALLEL_SIZE") or 1, 1),
            trust_remote_code=read.switch("TRUST_REMOTE_CODE"),
            kv_cache=kv_cache,
            kv_cache_cpu=kv_cache_cpu,
            extra_args_flags=frozenset(
                w[2:].split("=", 1)[0].replace("_", "-") for w in extra_words if w.startswith("--")
            ),
            extra_args_words=None if folded.extra_words is None else tuple(folded.extra_words),
            config_file=next((v for v in CONFIG_FILE_VARIABLES if v in values), None),
            offline=next((v for v in _OFFLINE_VARIABLES if envs.bool_word(values.get(v)) is True), None),
            modelscope=envs.bool_word(values.get("VLLM_USE_MODELSCOPE")) is True,
            name=name,
            overrides=dict(overrides or {}),
        )
        PARSES.count += 1
        return profile

    def written(self, name: str) -> str | None:
        """What the user wrote for one variable (stripped; None when unset or blank), no spelling folded:
        for a message to quote, never to decide on (the typed fields decide)."""
        return env_value(self.env, name)

    @property
    def token_set(self) -> bool:
        return self.hf_token is not None

    def variable(self, name: str) -> str | None:
        """The variable the user set for a knob (`REVISION` -> `MODEL_REVISION`); None when unset."""
        return self.sources.get(canonical(name))

    def changed(self, name: str, change: "ProfileChange", overrides: Mapping[str, str | None]) -> "LaunchProfile":
        """The profile a ladder step launches: this one with the step's typed `change` made, named `name`,
        `overrides` (the variables a user would write for the steps so far) as its record. Nothing is
        parsed again: each knob the change sets takes its typed value, and vLLM's option its value, unless
        a flag in VLLM_EXTRA_ARGS sets the knob (vLLM reads that flag last, so it still wins)."""
        variables = change.variables()
        takes = {knob for knob in map(canonical, variables) if self.sources.get(knob) != EXTRA_ARGS_NAME}

        def step(knob: str, value: T | None, current: T) -> T:
            return value if value is not None and knob in takes else current

        options = {option.name: option for option in self.options}
        sources = {key: source for key, source in self.sources.items() if key not in variables and key not in takes}
        for variable, text in variables.items():
            knob = canonical(variable)
            if text is None:
                options.pop(knob, None)
            else:
                options[knob] = Option(knob, text, variable, mask_text(text, self.secrets))
            if knob not in takes:
                sources[knob] = self.sources[knob]
            elif text is not None:
                sources[knob] = variable
        return replace(
            self,
            env=apply_overrides(self.env, variables),
            sources=sources,
            options=_in_table_order(options.values()),
            unreadable={knob: text for knob, text in self.unreadable.items() if knob not in takes},
            name=name,
            overrides=dict(overrides),
            max_num_seqs=step("MAX_NUM_SEQS", change.max_num_seqs, self.max_num_seqs),
            enforce_eager=step("ENFORCE_EAGER", change.enforce_eager, self.enforce_eager),
            max_num_batched_tokens=step("MAX_NUM_BATCHED_TOKENS", change.max_num_batched_tokens, self.max_num_batched_tokens),
            tensor_parallel_size=step("TENSOR_PARALLEL_SIZE", change.tensor_parallel_size, self.tensor_parallel_size),
            max_model_len="auto" if "MAX_MODEL_LEN" in takes else self.max_model_len,  # only ever to auto
            context_tokens=-1 if "MAX_MODEL_LEN" in takes else self.context_tokens,
            revision=None if "REVISION" in takes else self.revision,  # only ever unpinned
            tokenizer_revision=None if "TOKENIZER_REVISION" in takes else self.tokenizer_revision,
        )

    @property
    def utilization(self) -> float:
        """The share of the card vLLM may use: GPU_MEMORY_UTILIZATION, else vLLM's default (the one rule)."""
        return self.gpu_memory_utilization if self.gpu_memory_utilization is not None else DEFAULT_GPU_MEMORY_UTILIZATION

    @property
    def served_model(self) -> str | None:
        """The model vLLM loads: the baked folder when there is one, else MODEL_NAME."""
        return self.baked_model_path or self.model

    @staticmethod
    def default_max_num_seqs(max_concurrency: int) -> int:
        """The one MAX_NUM_SEQS default rule: the smallest multiple of 8 at least MAX_CONCURRENCY."""
        return multiple_of_8_at_least(max_concurrency)

    @property
    def worker_max_num_seqs(self) -> int:
        """The worker's own MAX_NUM_SEQS default for this profile's MAX_CONCURRENCY (the ladder's first memory step)."""
        return self.default_max_num_seqs(self.max_concurrency)

    def effective_max_num_seqs(self) -> int:
        """MAX_NUM_SEQS the engine runs with: the variable, else the worker's default for MAX_CONCURRENCY
        (the one MAX_NUM_SEQS default rule: the smallest multiple of 8 at least MAX_CONCURRENCY)."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return self.worker_max_num_seqs

    def known_max_num_seqs(self) -> int | None:
        """MAX_NUM_SEQS the engine runs with where the worker knows it: None where a config file passes it
        (the worker then passes no default of its own, so the file's value or vLLM's applies)."""
        if self.max_num_seqs is None and self.config_file is not None:
            return None
        return self.effective_max_num_seqs()

    def kv_cache_for(self, cpu: bool) -> KvCacheSize | None:
        return self.kv_cache_cpu if cpu else self.kv_cache


@dataclass(frozen=True)
class ProfileChange:
    """What one ladder step changes in a launch profile, typed: None (or empty) leaves a knob as it is.

    max_num_seqs, enforce_eager, max_num_batched_tokens, tensor_parallel_size: the knob's new value;
    context_auto: MAX_MODEL_LEN=auto (vLLM fits the longest context); unpinned: the revision variables
    removed (MODEL_REVISION, REVISION, TOKENIZER_REVISION, CODE_REVISION), so the default branch is served.
    """

    max_num_seqs: int | None = None
    enforce_eager: bool | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int | None = None
    context_auto: bool = False
    unpinned: tuple[str, ...] = ()

    def variables(self) -> dict[str, str | None]:
        """The change as the variables a user would write for it (None: the variable removed)."""
        written: dict[str, str | None] = {}
        if self.max_num_seqs is not None:
            written["MAX_NUM_SEQS"] = str(self.max_num_seqs)
        if self.enforce_eager is not None:
            written["ENFORCE_EAGER"] = "true" if self.enforce_eager else "false"
        if self.max_num_batched_tokens is not None:
            written["MAX_NUM_BATCHED_TOKENS"] = str(self.max_num_batched_tokens)
        if self.tensor_parallel_size is not None:
            written["TENSOR_PARALLEL_SIZE"] = str(self.tensor_parallel_size)
        if self.context_auto:
            written["MAX_MODEL_LEN"] = "auto"
        written.update({name: None for name in self.unpinned})
        return written


class _Parses:
    """How many times `LaunchProfile.parse` ran in this process (tests/unit/test_profile.py prints it per start)."""

    count = 0


PARSES = _Parses()

"""The capacity plan's KV accounting against the real vLLM 0.32 CPU engine, token for token.

With `--kv-cache-memory-bytes` fixed, nothing GPU-specific is left in the budget: the
KV tokens and the concurrency vLLM logs ("CPU KV cache size: N tokens, Maximum
concurrency for L tokens per request: Cx") follow only from the per-token bytes, the
page and block accounting, the hybrid groups and the null block. The shapes below are
generated here (MHA, GQA, MQA, head_dim 64 and 128, 2 to 5 layers, an fp8 KV cache,
sliding-window and hybrid layers, MLA), and the prediction must equal the engine's
figures exactly. KV sizes and context lengths are deliberately not multiples of a page
or a block, so rounding is exercised. One case is too small on purpose: vLLM refuses
it and names the longest context that fits, which must equal the plan's.

Each engine is killed as soon as it has printed its capacity line (it does so before
the API server is up), which halves the cost of a boot.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import engine_env
from tests.support.engine_env import BOOT_TIMEOUT, ENGINE_PYTHON, REPO, STOP_GRACE
from vllm_worker import capacity
from vllm_worker.capacity import plan_settings
from vllm_worker.engine.process import Engine

CACHE = REPO / ".cache"


@dataclass(frozen=True)
class Shape:
    name: str
    model: str  # key of MODELS
    max_model_len: int
    kv_bytes: int
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 8
    kv_cache_dtype: str | None = None

    def env(self) -> dict[str, str]:
        """The worker variables for this launch (what the plan reads)."""
        env = {
            "MAX_MODEL_LEN": str(self.max_model_len),
            "MAX_NUM_SEQS": str(self.max_num_seqs),
            "MAX_NUM_BATCHED_TOKENS": str(self.max_num_batched_tokens),
            "KV_CACHE_MEMORY_BYTES": str(self.kv_bytes),
            "ENFORCE_EAGER": "true",
            "DTYPE": "bfloat16",
        }
        if self.kv_cache_dtype:
            env["KV_CACHE_DTYPE"] = self.kv_cache_dtype
        return env

    def flags(self) -> list[str]:
        """The same launch as `vllm serve` flags (what the engine reads)."""
        flags = [
            # No --disable-log-stats: with it vLLM registers no vllm:cache_config_info gauge.
            "--enforce-eager", "--dtype", "bfloat16",
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--kv-cache-memory-bytes", str(self.kv_bytes),
        ]
        if self.kv_cache_dtype:
            flags += ["--kv-cache-dtype", self.kv_cache_dtype]
        return flags


@dataclass(frozen=True)
class ModelSpec:
    tiny: dict[str, int]  # make_tiny_model shape
    config_patch: dict[str, object] = field(default_factory=dict)  # written over config.json
    mla: bool = False


MODELS: dict[str, ModelSpec] = {
    "mha": ModelSpec({"layers": 2, "heads": 4, "kv_heads": 4, "head_dim": 64}),
    "gqa": ModelSpec({"layers": 4, "heads": 8, "kv_heads": 2, "head_dim": 64}),
    "mqa": ModelSpec({"layers": 2, "heads": 4, "kv_heads": 1, "head_dim": 128}),
    "gqa128": ModelSpec({"layers": 3, "heads": 4, "kv_heads": 2, "head_dim": 128}),
    # All layers sliding (Mistral-style): one group, the window bounds each request's blocks.
    "sliding": ModelSpec({"layers": 2, "heads": 2, "kv_heads": 2, "head_dim": 64},
                         {"layer_types": ["sliding_attention"] * 2, "sliding_window": 100}),
    # 3 sliding + 2 full (Gemma-style interleaving): hybrid groups with uneven group sizes.
    "hybrid": ModelSpec({"layers": 5, "heads": 2, "kv_heads": 2, "head_dim": 64},
                        {"layer_types": ["sliding_attention", "full_attention"] * 2 + ["sliding_attention"],
                         "sliding_window": 200}),
    # DeepSeek-V2 MLA: one 576-wide latent per token and layer (the CPU MLA kernel's only size).
    "mla": ModelSpec({}, mla=True),
}

SHAPES = [
    Shape("mha-2-layers", "mha", max_model_len=500, kv_bytes=3_000_001),
    Shape("gqa-4-layers", "gqa", max_model_len=1000, kv_bytes=5_000_000, max_num_batched_tokens=1000),
    Shape("mqa-head-dim-128", "mqa", max_model_len=777, kv_bytes=2_500_000),
    Shape("gqa-head-dim-128", "gqa128", max_model_len=2048, kv_bytes=9_000_000, max_num_seqs=4),
    Shape("gqa-fp8-kv-cache", "gqa", max_model_len=1000, kv_bytes=5_000_000, kv_cache_dtype="fp8"),
    Shape("sliding-window", "sliding", max_model_len=1000, kv_bytes=3_000_000, max_num_batched_tokens=256),
    Shape("hybrid-sliding-full", "hybrid", max_model_len=1500, kv_bytes=4_000_000, max_num_batched_tokens=256),
    Shape("mla", "mla", max_model_len=500, kv_bytes=3_000_000),
]

MLA_GENERATOR = r"""
import json, shutil, sys, torch
from pathlib import Path
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
tokenizer_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
base = json.loads((tokenizer_dir / "config.json").read_text())
torch.manual_seed(0)
config = DeepseekV2Config(
    vocab_size=base["vocab_size"], hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048, kv_lora_rank=512,
    q_lora_rank=None, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64, first_k_dense_replace=2,
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, n_shared_experts=1,
    bos_token_id=base["bos_token_id"], eos_token_id=base["eos_token_id"], pad_token_id=base["pad_token_id"],
    tie_word_embeddings=False)
DeepseekV2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
for f in tokenizer_dir.iterdir():
    if f.name.startswith(("tokenizer", "special")) or f.name == "chat_template.jinja":
        shutil.copy(f, out / f.name)
saved = json.loads((out / "config.json").read_text())
saved["dtype"] = saved["torch_dtype"] = "bfloat16"
(out / "config.json").write_text(json.dumps(saved, indent=1))
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    engine_env.require_engine()
    root = tmp_path_factory.mktemp("capacity-models")
    made: dict[str, Path] = {}
    for name, spec in MODELS.items():
        if spec.mla:
            out = root / name
            done = subprocess.run(
                [str(ENGINE_PYTHON), "-c", MLA_GENERATOR, str(engine_env.make_tiny_model()), str(out)],
                capture_output=True, text=True,
            )
            assert done.returncode == 0, done.stderr[-2000:]
            made[name] = out
            continue
        base = engine_env.make_tiny_model(CACHE / f"capacity-{name}", **spec.tiny)
        if spec.config_patch:
            out = root / name
            shutil.copytree(base, out)
            config = json.loads((out / "config.json").read_text())
            config.update(spec.config_patch)
            (out / "config.json").write_text(json.dumps(config, indent=2))
            made[name] = out
        else:
            made[name] = base
    return made


def boot_until_capacity(model: Path, flags: list[str], *, wait_ready: bool = False) -> tuple[str, str | None]:
    """Start `vllm serve`, stop it once it printed its KV capacity (or failed); (output, /metrics or None)."""
    port = engine_env.free_port()
    argv = engine_env.serve_argv(model, port, flags=flags)
    seen = threading.Event()

    def on_line(line: str) -> None:
        if "KV cache size:" in line or "estimated maximum model length" in line:
            seen.set()

    engine = Engine(argv, engine_env.engine_env(), "127.0.0.1", port, tail_lines=5000, on_line=on_line)
    engine.start()
    metrics = None
    try:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while not seen.is_set() and engine.alive() and time.monotonic() < deadline:
            seen.wait(0.5)
        if wait_ready and seen.is_set():
            if engine.wait_ready(max(1.0, deadline - time.monotonic())) == "ready":
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                    metrics = response.read().decode()
    finally:
        # Its output is all the test reads: an engine stopped in the middle of its start ignores
        # SIGTERM until the grace runs out (measured: 30 s, then SIGKILL), so it is killed at once.
        engine.stop(0 if not wait_ready else STOP_GRACE)
    return engine.tail(), metrics


def predicted(model: Path, shape: Shape) -> capacity.Plan:
    facts = capacity.facts_from_folder(model)
    # On an AMX CPU (and with setup.sh's hook asking Linux for AMX state) vLLM runs MLA on AMX_MLA.
    knobs = capacity.knobs_from_env(shape.env(), platform="cpu", cpu_amx=plan_settings.cpu_has_amx())
    return capacity.plan(facts, None, knobs)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_predicted_kv_tokens_equal_the_engine(models: dict[str, Path], shape: Shape) -> None:
    model = models[shape.model]
    plan = predicted(model, shape)
    wait_ready = shape.name == "mha-2-layers"  # one case also reads the Prometheus metric
    output, metrics = boot_until_capacity(model, shape.flags(), wait_ready=wait_ready)
    actual = capacity.parse_engine_capacity(output)
    assert actual is not None, f"no capacity line in the engine's output:\n{output[-4000:]}"
    print(
        f"{shape.name}: predicted {plan.kv_cache_tokens} tokens {plan.max_concurrency:.2f}x, "
        f"engine {actual.kv_tokens} tokens {actual.max_concurrency:.2f}x "
        f"({plan.kv_bytes_per_token} B/token, {plan.num_blocks} blocks of {plan.block_size}, {plan.bytes_per_block} B/block)"
    )
    assert plan.fits and plan.verdict == "fits"
    assert actual.kv_tokens == plan.kv_cache_tokens
    assert f"{actual.max_concurrency:.2f}" == f"{plan.max_concurrency:.2f}"
    assert actual.max_model_len == plan.max_model_len == shape.max_model_len
    if wait_ready:
        assert metrics is not None, f"the engine did not become ready:\n{output[-4000:]}"
        from_metric = capacity.parse_cache_config_metric(metrics)
        assert from_metric is not None
        assert from_metric.kv_tokens == plan.kv_cache_tokens
        assert from_metric.max_concurrency == pytest.approx(plan.max_concurrency)


def test_too_small_a_cache_is_refused_at_the_predicted_length(models: dict[str, Path]) -> None:
    shape = Shape("mha-too-small", "mha", max_model_len=500, kv_bytes=1_000_000)
    plan = predicted(models["mha"], shape)
    assert plan.verdict == "does_not_fit" and plan.max_model_len_fits > 0
    output, _ = boot_until_capacity(models["mha"], shape.flags())
    assert "KV cache is needed, which is larger than the available KV cache memory" in output, output[-4000:]
    assert f"the estimated maximum model length is {plan.max_model_len_fits}." in output
    assert any(c.variable == "MAX_MODEL_LEN" and c.value == str(plan.max_model_len_fits) for c in plan.changes)

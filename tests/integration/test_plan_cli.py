"""`vllm-worker plan` and the startup plan, with the real huggingface_hub client against a Hub stand-in.

The CLI runs as a process, the way a person runs it; the Hub is the stand-in on
127.0.0.1 reached through HF_ENDPOINT, so config.json and the safetensors metadata
travel through huggingface_hub's own URL building, headers and error mapping.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.hub_stub import HubStub
from tests.support.model_configs import LLAMA_31_8B, LLAMA_31_8B_PARAMS
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.diagnosis.hub import gated_repo_message, repo_not_found_message
from vllm_worker import capacity
from vllm_worker.diagnosis import startup_errors
from vllm_worker.capacity import GiB

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_planreader0123456789"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
SAFETENSORS = {"parameters": LLAMA_31_8B_PARAMS, "total": sum(LLAMA_31_8B_PARAMS.values())}
PLAN_CLI = "import sys; from vllm_worker.capacity import plan_cli; sys.exit(plan_cli(sys.argv[1:]))"


@pytest.fixture
def hub() -> Iterator[HubStub]:
    with HubStub() as stub:
        config = json.dumps(LLAMA_31_8B)
        stub.add_repo(LLAMA, files={"config.json": config}, safetensors=SAFETENSORS)
        stub.add_repo("org/gated", files={"config.json": config}, gated="manual", safetensors=SAFETENSORS)
        stub.add_repo("org/private", files={"config.json": config}, private=True, authorized_tokens=[TOKEN],
                      safetensors=SAFETENSORS)
        yield stub


def model_requests(hub: HubStub) -> list:
    """Requests about models (huggingface_hub also fetches its agent-harness registry on its own)."""
    return [r for r in hub.requests if not r.path.startswith("/api/agent-harnesses")]


def run_plan(hub: HubStub | None, *args: str, token: str | None = None, command: list[str] | None = None,
             home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    if hub is not None:
        env["HF_ENDPOINT"] = hub.endpoint
    if token:
        env["HF_TOKEN"] = token
    if home is not None:
        env["HF_HOME"] = str(home)
    argv = command or [sys.executable, "-c", PLAN_CLI]
    return subprocess.run([*argv, *args], capture_output=True, text=True, env=env, timeout=120, cwd=REPO_ROOT)


def test_json_for_a_hub_model(hub: HubStub, tmp_path: Path) -> None:
    done = run_plan(hub, LLAMA, "--gpu-memory", "24GiB", "--max-model-len", "8192", "--json", home=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["weights_bytes"] == 2 * 8030261248
    assert data["kv_bytes_per_token"] == 32 * 8 * 2 * 128 * 2
    assert data["requested_bytes"] == math.ceil(24 * GiB * 0.92)
    # The KV accounting relations vLLM uses, with GPU blocks of 16 tokens (2 MiB for this shape):
    blocks = data["num_blocks"]
    assert data["kv_cache_bytes"] // (2 * 1024 * 1024) == blocks
    assert data["kv_cache_tokens"] == blocks * 16
    assert data["max_concurrency"] == pytest.approx(blocks / (8192 / 16), abs=1e-4)
    # vLLM's own estimate at the predicted memory, and the band around it; the plan states the low end.
    assert data["max_model_len_fits"] == min(131072, (blocks - 1) * 16)
    assert data["max_model_len"] == data["max_model_len_low"] < data["max_model_len_fits"] < data["max_model_len_high"]
    assert data["context_len"] == 8192 and data["verdict"] == "fits" and data["fits"] is True
    # Two Hub requests, no weights: config.json and the safetensors metadata.
    requests = model_requests(hub)
    assert sorted(r.path for r in requests) == [f"/api/models/{LLAMA}", f"/{LLAMA}/resolve/main/config.json"]
    assert any(r.query.get("expand") == ["safetensors"] for r in requests)


def test_table_when_it_does_not_fit(hub: HubStub, tmp_path: Path) -> None:
    done = run_plan(hub, LLAMA, "--gpu", "RTX 4090", home=tmp_path)
    assert done.returncode == 1, done.stderr
    table = done.stdout
    for label in ("weights", "KV per token", "KV tokens", "longest context", "concurrency", "verdict"):
        assert f"\n{label}" in table or table.startswith(label)
    assert "DOES NOT FIT" in table and "RTX 4090" in table
    smallest = next(line for line in table.splitlines() if line.startswith("smallest change"))
    assert "--max-model-len" in smallest


def test_table_and_json_state_one_longest_context(hub: HubStub, tmp_path: Path) -> None:
    args = (LLAMA, "--gpu", "RTX 4090")
    table = run_plan(hub, *args, home=tmp_path).stdout
    data = json.loads(run_plan(hub, *args, "--json", home=tmp_path).stdout)
    rows = dict(line.split("  ", 1) for line in table.splitlines() if "  " in line)
    stated = int(re.match(r"\s*([\d,]+) tokens", rows["longest context"]).group(1).replace(",", ""))
    assert stated == data["max_model_len"] == data["max_model_len_low"]
    assert f"error band {stated:,} to {data['max_model_len_high']:,}" in rows["longest context"]
    suggested = next(c for c in data["changes"] if c["variable"] == "MAX_MODEL_LEN")
    assert suggested["value"] == str(stated)
    assert f"--max-model-len {stated} (the longest context that fits" in table
    assert data["verdict"] == "does_not_fit" and "DOES NOT FIT" in rows["verdict"]
    # A context inside the band is too close to call: the CLI says so and exits 0 (vLLM may well start).
    inside = (data["max_model_len_fits"] + data["max_model_len_high"]) // 2
    close = run_plan(hub, *args, "--max-model-len", str(inside), "--json", home=tmp_path)
    assert close.returncode == 0 and json.loads(close.stdout)["verdict"] == "too_close_to_call"


def test_flags_change_the_plan(hub: HubStub, tmp_path: Path) -> None:
    base = json.loads(run_plan(hub, LLAMA, "--gpu-memory", "80GiB", "--max-model-len", "8192", "--json",
                               home=tmp_path).stdout)
    fp8 = json.loads(run_plan(hub, LLAMA, "--gpu-memory", "80GiB", "--max-model-len", "8192", "--json",
                              "--kv-cache-dtype", "fp8", home=tmp_path).stdout)
    eager = json.loads(run_plan(hub, LLAMA, "--gpu-memory", "80GiB", "--max-model-len", "8192", "--json",
                                "--enforce-eager", home=tmp_path).stdout)
    tp = json.loads(run_plan(hub, LLAMA, "--gpu-memory", "80GiB", "--max-model-len", "8192", "--json",
                             "--gpus", "2", home=tmp_path).stdout)
    assert fp8["kv_bytes_per_token"] * 2 == base["kv_bytes_per_token"]
    assert eager["cudagraph_bytes"] == 0 < base["cudagraph_bytes"]
    assert tp["kv_bytes_per_token"] * 2 == base["kv_bytes_per_token"] and tp["weights_bytes"] * 2 == base["weights_bytes"]


def test_local_folder(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA_31_8B, "num_hidden_layers": 2}))
    # The safetensors layout: u64 little-endian header length, JSON header (the data is not read).
    header = {
        "embed": {"dtype": "BF16", "shape": [128256, 4096], "data_offsets": [0, 2 * 128256 * 4096]},
        "scale": {"dtype": "F32", "shape": [4096], "data_offsets": [2 * 128256 * 4096, 2 * 128256 * 4096 + 4 * 4096]},
    }
    raw = json.dumps(header).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    done = run_plan(None, str(model), "--gpu", "L40S", "--max-model-len", "4096", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["weights_bytes"] == 2 * (128256 * 4096 + 4096)  # unquantized: floats in the model dtype
    assert data["kv_bytes_per_token"] == 2 * 8 * 2 * 128 * 2
    assert data["gpu"] == "L40S"


def test_gated_and_missing_repos_say_what_to_do(hub: HubStub, tmp_path: Path) -> None:
    gated = run_plan(hub, "org/gated", "--json", home=tmp_path)
    assert gated.returncode == 2
    expected = gated_repo_message("org/gated", "MODEL")
    assert json.loads(gated.stdout)["error"] == expected
    missing = run_plan(hub, "org/nothing-here", home=tmp_path)
    assert missing.returncode == 2
    assert repo_not_found_message("org/nothing-here", "MODEL") in missing.stderr


def test_hf_token_is_honoured_and_never_printed(hub: HubStub, tmp_path: Path) -> None:
    denied = run_plan(hub, "org/private", "--json", home=tmp_path)
    assert denied.returncode == 2
    done = run_plan(hub, "org/private", "--max-model-len", "8192", "--json", token=TOKEN, home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    assert {r.token for r in hub.requests if "org/private" in r.path} >= {TOKEN}


def _plan_is_wired() -> bool:
    return '"plan"' in (REPO_ROOT / "src" / "vllm_worker" / "main.py").read_text()


@pytest.mark.skipif(not _plan_is_wired(), reason="main.cli does not route `vllm-worker plan` to capacity.plan_cli yet")
def test_console_script(hub: HubStub, tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "vllm-worker"
    done = run_plan(hub, LLAMA, "--gpu-memory", "24GiB", "--max-model-len", "8192", "--json",
                    command=[str(script), "plan"], home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["kv_bytes_per_token"] == 131072


# --- the startup plan over the same Hub ------------------------------------------------------------


def test_startup_plan_reuses_the_preflight_counts(hub: HubStub) -> None:
    env = {"MODEL_NAME": LLAMA, "HF_ENDPOINT": hub.endpoint, "MAX_MODEL_LEN": "8192"}
    sp = capacity.startup_plan(LaunchProfile.parse(env), 24 * GiB, safetensors_parameters=LLAMA_31_8B_PARAMS)
    assert sp.status == "as_configured", sp.log_line
    assert [r.path for r in model_requests(hub)] == [f"/{LLAMA}/resolve/main/config.json"]  # no metadata call
    hub.reset_requests()
    again = capacity.startup_plan(LaunchProfile.parse(env), 24 * GiB)
    assert again.predicted is not None and sp.predicted is not None
    assert again.predicted.kv_cache_tokens == sp.predicted.kv_cache_tokens
    assert len(model_requests(hub)) == 2


def test_startup_plan_never_blocks_the_boot(hub: HubStub) -> None:
    hub.hang(times=None)  # the Hub accepts config.json's request and never answers it
    env = {"MODEL_NAME": LLAMA, "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": TOKEN}
    sp = capacity.startup_plan(LaunchProfile.parse(env), 24 * GiB, safetensors_parameters=LLAMA_31_8B_PARAMS, timeout=0.5)
    # It returned although the request it made is still unanswered: it gave up on its own timeout.
    assert [r.path for r in model_requests(hub)] == [f"/{LLAMA}/resolve/main/config.json"]
    assert sp.status == "unknown" and sp.overrides == {} and sp.fatal_message is None
    assert sp.log_line == "capacity plan unavailable (timed out); launching as configured"


def test_startup_plan_for_a_gated_model_without_access_is_unknown(hub: HubStub) -> None:
    env = {"MODEL_NAME": "org/gated", "HF_ENDPOINT": hub.endpoint}
    sp = capacity.startup_plan(LaunchProfile.parse(env), 24 * GiB)
    assert sp.status == "unknown"  # the pre-flight owns that answer; the plan stays out of the way

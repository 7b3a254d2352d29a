"""The GPU edges' parsers and the card table against what a real card answered (tests/field/gpu_readings).

The CPU tiers test nvidia-smi's and the allocation child's texts through samples shaped like them;
these tests read the texts a real H200 printed, and hold what the worker makes of them against
NVML's and CUDA's figures read at the same moment, so a parser that drifts from the real output
fails here, on every machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_worker.capacity import memory_budget
from vllm_worker.capacity.gpus import DRIVER_RESERVED_MIB, find_card
from vllm_worker.engine import gpu_memory, machine_checks
from vllm_worker.engine.gpu_memory import Holder

MiB = 1 << 20
GiB = 1 << 30
H200 = Path(__file__).resolve().parents[1] / "field" / "gpu_readings" / "h200_2026-12-04"


def text(name: str) -> str:
    return (H200 / name).read_text()


@pytest.fixture(scope="module")
def readings() -> dict[str, Any]:
    return json.loads(text("readings.json"))


def smi(prefix: str) -> Any:
    """nvidia-smi as the probe calls it, answering with what the card printed."""

    def run(argv: list[str]) -> str | None:
        query = argv[1]
        if query.startswith("--query-compute-apps"):
            return text(f"{prefix}_query_apps.txt")
        if "memory.reserved" in query:
            return text(f"{prefix}_query_gpu.txt")
        return text("idle_query_gpu_old.txt")

    return run


def test_nvidia_smis_total_less_reserved_is_cudas_total(readings: dict[str, Any]) -> None:
    [row] = gpu_memory.parse_query_gpu(text("idle_query_gpu.txt"))
    assert (row.index, row.name, row.total_mib, row.reserved_mib) == (0, "NVIDIA H200", 143771, 616)
    cuda_total = readings["context"]["cuda_total"]
    assert abs((row.total_mib - row.reserved_mib) * MiB - cuda_total) < MiB


def test_nvmls_total_less_reserved_is_exactly_cudas_total(readings: dict[str, Any]) -> None:
    nvml = readings["idle_nvml"]
    assert nvml["v2_total"] - nvml["v2_reserved"] == readings["context"]["cuda_total"]
    assert readings["idle_probe_nvml"][0]["total"] == readings["context"]["cuda_total"]


def test_an_idle_cards_rounded_free_is_not_reported_above_its_total() -> None:
    """nvidia-smi rounds each figure on its own: idle, it printed free 143156 MiB of 143771 - 616 = 143155."""
    [row] = gpu_memory.parse_query_gpu(text("idle_query_gpu.txt"))
    assert row.free_mib > row.total_mib - row.reserved_mib  # the reading itself
    [device] = gpu_memory.probe_nvidia_smi([0], run=smi("idle")) or []
    assert device.free == device.total == 143155 * MiB
    assert device.holders == []


def test_a_holder_is_read_with_its_pid_and_memory(readings: dict[str, Any]) -> None:
    [device] = gpu_memory.probe_nvidia_smi([0], run=smi("held")) or []
    assert device.holders == [Holder(570, 103010 * MiB, "/opt/torch/.venv/bin/python3")]
    nvml_holder = readings["held_probe_nvml"][0]["holders"][0]
    assert nvml_holder["pid"] == 570 and abs(nvml_holder["used_bytes"] - 103010 * MiB) < MiB
    assert abs(device.free - readings["held_nvml"]["v2_free"]) <= 2 * MiB


def test_the_wait_on_that_reading_names_the_holder(readings: dict[str, Any]) -> None:
    from vllm_worker.config.profile import LaunchProfile

    devices = gpu_memory.probe_nvidia_smi([0], run=smi("held"))
    assert devices is not None
    samples = [gpu_memory.Sample(0.0, devices), gpu_memory.Sample(301.0, devices)]
    decision = gpu_memory.decide(samples, LaunchProfile.parse({}), gpu_memory.WaitPolicy())
    assert isinstance(decision, gpu_memory.Timeout)
    assert "GPU 0 (NVIDIA H200)" in decision.message
    assert "pid 570 (/opt/torch/.venv/bin/python3) holds 103010 MiB" in decision.message


def test_the_allocation_childs_lines_from_the_card() -> None:
    assert machine_checks.parse_allocations(text("allocate_0.txt"), [0]) == {0: None}
    assert machine_checks.parse_allocations(text("allocate_0_1.txt"), [0, 1]) == {0: None, 1: "CUDA_ERROR_INVALID_DEVICE (101)"}
    check = machine_checks.judge_gpus(["NVIDIA H200"], 1, machine_checks.parse_allocations(text("allocate_0.txt"), [0]))
    assert check.ok and check.found == "1 GPU(s) (0: NVIDIA H200); a 64 MiB allocation on 1 of 1"


def test_the_card_table_holds_the_h200s_cuda_total(readings: dict[str, Any]) -> None:
    names = [line.strip() for line in text("idle_query_names.txt").splitlines() if line.strip()]
    assert names == readings["list_gpus"] == ["NVIDIA H200"]
    card = find_card(names[0])
    assert card.smi_total_mib == 143771
    assert abs(card.total_bytes - readings["context"]["cuda_total"]) < 0.005 * GiB


def test_the_h200s_reservation_against_the_tables_estimate() -> None:
    """The estimate (for cards whose CUDA total no log shows) is 450 MiB; the H200 reserves 616: the
    table keeps the H200's logged total, so its plan does not use the estimate."""
    [row] = gpu_memory.parse_query_gpu(text("idle_query_gpu.txt"))
    assert row.reserved_mib - DRIVER_RESERVED_MIB == 166
    assert find_card("H200").cuda_total_gib is not None


def test_a_cuda_context_on_the_h200_lies_in_the_plans_allowance(readings: dict[str, Any]) -> None:
    context = readings["context"]
    assert context["nvml_used_before"] == 0
    measured = context["nvml_used_with_context"]
    assert measured == context["cuda_total"] - context["cuda_free"]  # NVML and CUDA agree on what the context took
    low = memory_budget.CUDA_CONTEXT_BYTES - memory_budget.CUDA_CONTEXT_ERROR
    high = memory_budget.CUDA_CONTEXT_BYTES + memory_budget.CUDA_CONTEXT_ERROR
    assert low <= measured <= high, measured / MiB


def test_the_sdks_own_gpu_check_passed_on_the_card(readings: dict[str, Any]) -> None:
    assert "GPU 0 memory allocation test passed." in text("sdk_gpu_test.txt")
    assert readings["sdk_gpu_test_parsed"]["success"] is True

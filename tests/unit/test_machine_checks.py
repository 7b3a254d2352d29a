"""The worker's own checks of its machine (engine.machine_checks): each judgement, and what it answers."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from vllm_worker.engine import gpu_memory, machine_checks as mc

GiB = 1 << 30


def test_the_memory_floor_is_the_sdks_variable_or_its_default() -> None:
    assert mc.min_memory_bytes({}) == 4 * GiB
    assert mc.min_memory_bytes({"RUNPOD_MIN_MEMORY_GB": "8"}) == 8 * GiB
    assert mc.min_memory_bytes({"RUNPOD_MIN_MEMORY_GB": "0.5"}) == GiB // 2
    for unreadable in ("", " ", "lots", "nan", "inf", "-1"):
        assert mc.min_memory_bytes({"RUNPOD_MIN_MEMORY_GB": unreadable}) == 4 * GiB, unreadable


def test_memory_at_the_floor_passes_and_below_it_names_the_figures_and_another_gpu_type() -> None:
    assert mc.judge_memory(4 * GiB, 4 * GiB).ok
    short = mc.judge_memory(4 * GiB - 1, 4 * GiB)
    assert not short.ok and not short.fresh_machine
    assert short.failure is not None and "RUNPOD_MIN_MEMORY_GB=4" in short.failure
    assert "choose a GPU type with more system memory" in short.failure
    assert "4.0 GiB available" in short.found
    unread = mc.judge_memory(None, 4 * GiB)
    assert unread.ok and "could not be read" in unread.found


def test_no_gpu_listed_means_the_gpu_checks_do_not_apply() -> None:
    for listed in (None, []):
        check = mc.judge_gpus(listed, 1, None)
        assert check.ok and "do not apply" in check.found


def test_fewer_gpus_than_the_launch_needs_is_the_configuration() -> None:
    check = mc.judge_gpus(["H100"], 2, None)
    assert not check.ok and not check.fresh_machine
    assert check.failure is not None and "needs 2 GPUs" in check.failure and "has 1" in check.failure
    assert mc.judge_gpus(["H100", "H100"], 2, {0: None, 1: None}).ok


def test_a_gpu_that_cannot_allocate_is_the_machines_and_the_first_failing_one_is_named() -> None:
    check = mc.judge_gpus(["A", "B", "C"], 3, {0: None, 2: "CUDA_ERROR_ECC_UNCORRECTABLE (214)", 1: "CUDA_ERROR_OUT_OF_MEMORY (2)"})
    assert not check.ok and check.fresh_machine
    assert check.failure is not None and check.failure.startswith("GPU 1 of this machine cannot allocate memory (CUDA_ERROR_OUT_OF_MEMORY (2))")
    assert "on 1 of 3" in check.found


def test_the_disk_check_needs_the_download_and_a_spare_gigabyte() -> None:
    folder = Path("/runpod-volume/huggingface-cache/hub/models--a--b")
    need = 10 * GiB
    assert mc.judge_disk(folder, need + mc.DISK_SPARE_BYTES, need, "the container disk").ok
    short = mc.judge_disk(folder, need + mc.DISK_SPARE_BYTES - 1, need, "the container disk")
    assert not short.ok and not short.fresh_machine and short.failure is not None
    assert "raise the endpoint's container disk by at least 1 GB" in short.failure
    assert "network volume at BASE_PATH" in short.failure and str(folder) in short.failure
    far = mc.judge_disk(folder, 0, need, "the container disk")
    assert far.failure is not None and "by at least 12 GB" in far.failure  # 10 GiB + 1 GiB, in GB, rounded up
    assert mc.judge_disk(folder, None, need, "x").ok and mc.judge_disk(folder, 0, None, "x").ok


def test_the_disk_check_counts_only_what_is_left_to_download(tmp_path: Path) -> None:
    folder = tmp_path / "models--a--b"
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / "part").write_bytes(b"\0" * 1000)
    (folder / "snapshots").mkdir()
    (folder / "snapshots" / "link").symlink_to(folder / "blobs" / "part")
    assert mc.present_bytes(folder) == 1000
    check = mc.disk_for_download(folder, 1500, "the container disk")
    assert "needs 0.0 GiB more" in check.found
    assert mc.free_bytes(tmp_path / "not" / "yet" / "made") == mc.free_bytes(tmp_path)


def test_a_machine_fault_is_answered_before_a_configuration_cause() -> None:
    memory = mc.Check("memory", "x", "too little memory")
    gpu = mc.Check("gpus", "y", "GPU 0 cannot allocate", fresh_machine=True)
    assert mc.first_failure([memory, gpu]) is gpu
    assert mc.first_failure([memory, mc.internet()]) is memory
    assert mc.first_failure([mc.internet()]) is None


def test_the_internet_is_not_checked_and_the_line_says_why() -> None:
    check = mc.internet()
    assert check.ok and "8.8.8.8" in check.found and "pre-flight" in check.found
    assert check.log_line().startswith("machine check internet: ok: not checked")


def test_the_allocation_childs_lines_are_read_per_device() -> None:
    assert mc.parse_allocations("0 ok\n1 CUDA_ERROR_OUT_OF_MEMORY (2)\n", [0, 1]) == {0: None, 1: "CUDA_ERROR_OUT_OF_MEMORY (2)"}
    assert mc.parse_allocations("all cuInit failed: CUDA_ERROR_NO_DEVICE (100)\n", [0, 1]) == {
        0: "cuInit failed: CUDA_ERROR_NO_DEVICE (100)",
        1: "cuInit failed: CUDA_ERROR_NO_DEVICE (100)",
    }
    assert mc.parse_allocations("0 ok\n", [0, 1]) == {0: None, 1: "the allocation test ended before this GPU"}
    assert mc.parse_allocations("7 ok\n", [0]) == {0: "the allocation test ended before this GPU"}


def test_the_allocation_runs_in_a_child_and_its_failures_to_run_are_answers() -> None:
    seen: list[list[str]] = []

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "0 ok\n1 ok\n", "")

    assert mc.allocate_each([0, 1], run) == {0: None, 1: None}
    assert seen[0][-3:] == [str(mc.ALLOCATION_BYTES), "0", "1"]
    assert mc.allocate_each([], run) == {} and len(seen) == 1

    def hangs(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    assert "did not end within 60 s" in (mc.allocate_each([0], hangs)[0] or "")

    def missing(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise OSError("no python")

    assert "could not run" in (mc.allocate_each([0], missing)[0] or "")


def test_without_a_cuda_driver_the_allocation_child_says_so() -> None:
    """On this machine there is no libcuda: the real child answers for every device, it does not crash."""
    result = mc.allocate_each([0])
    assert list(result) == [0]
    assert result[0] is None or "libcuda" in result[0] or "cu" in result[0]


def test_before_the_preflight_the_checks_run_in_order_and_allocate_only_what_the_launch_uses() -> None:
    asked: list[list[int]] = []

    def allocate(indexes: Any) -> dict[int, str | None]:
        asked.append(list(indexes))
        return {i: None for i in indexes}

    checks = mc.before_preflight({}, 2, "auto", gpus=lambda: ["A", "B", "C", "D"], memory=lambda: 64 * GiB, allocate=allocate)
    assert [c.name for c in checks] == ["memory", "gpus", "internet"] and all(c.ok for c in checks)
    assert asked == [[0, 1]]
    few = mc.before_preflight({}, 2, "auto", gpus=lambda: ["A"], memory=lambda: 64 * GiB, allocate=allocate)
    assert not few[1].ok and asked == [[0, 1]]  # nothing allocated when the count is already short
    cpu = mc.before_preflight({"RUNPOD_MIN_MEMORY_GB": "128"}, 1, "cpu", gpus=lambda: ["A"], memory=lambda: 64 * GiB, allocate=allocate)
    assert not cpu[0].ok and cpu[1].ok and "ENGINE_DEVICE=cpu" in cpu[1].found


def test_the_available_memory_is_capped_by_the_cgroup(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    assert mc.available_memory(str(tmp_path)) == 4000000 * 1024
    cgroup = tmp_path / "sys" / "fs" / "cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text(str(3 * GiB))
    (cgroup / "memory.current").write_text(str(2 * GiB))
    assert mc.available_memory(str(tmp_path)) == GiB
    assert mc.available_memory(str(tmp_path / "nowhere")) is None


class FakeNvml:
    def __init__(self, names: list[str] | None) -> None:
        self.names = names

    def nvmlInit(self) -> None:
        if self.names is None:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names or [])

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return (self.names or [])[handle].encode()


def test_the_gpus_are_listed_by_nvml_else_nvidia_smi() -> None:
    smi = lambda argv: "NVIDIA H200\nNVIDIA H200\n"  # noqa: E731
    assert gpu_memory.list_gpus(FakeNvml(["NVIDIA H100 80GB HBM3"]), smi) == ["NVIDIA H100 80GB HBM3"]
    assert gpu_memory.list_gpus(FakeNvml(None), smi) == ["NVIDIA H200", "NVIDIA H200"]
    assert gpu_memory.list_gpus(FakeNvml([]), smi) == ["NVIDIA H200", "NVIDIA H200"]
    assert gpu_memory.list_gpus(FakeNvml(None), lambda argv: None) is None
    assert gpu_memory.list_gpus(FakeNvml(None), lambda argv: "\n") is None


@pytest.mark.parametrize("ok", [True, False])
def test_a_check_line_says_what_it_found(ok: bool) -> None:
    check = mc.Check("disk", "9.0 GiB free", None if ok else "too small")
    assert check.log_line() == f"machine check disk: {'ok' if ok else 'FAILED'}: 9.0 GiB free"

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
    assert mc.parse_allocations("7 ok\n", [0]) == {}  # answered for no device asked about: not run
    assert mc.parse_allocations("skip undefined symbol: cuDevicePrimaryCtxRetain\n", [0, 1]) == {}
    assert mc.parse_allocations("Traceback (most recent call last):\n", [0]) == {}


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


def test_the_sentences_in_full() -> None:
    assert mc.judge_memory(2 * GiB, 4 * GiB) == mc.Check(
        "memory",
        "2.0 GiB available, at least 4.0 GiB wanted (RUNPOD_MIN_MEMORY_GB)",
        "This machine has 2.0 GiB of memory available, less than the 4.0 GiB the worker and vLLM need beside the "
        "GPU (RUNPOD_MIN_MEMORY_GB=4): choose a GPU type with more system memory for the endpoint.",
    )
    assert mc.judge_gpus(["H100"], 2, None) == mc.Check(
        "gpus",
        "1 GPU(s) (0: H100), the launch needs 2",
        "The launch needs 2 GPUs (TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE) and this worker has 1: set the "
        "endpoint's GPUs per worker to 2, or the parallel sizes to fit 1.",
    )
    assert mc.judge_gpus(["A", "B"], 2, {0: None, 1: None}) == mc.Check(
        "gpus", "2 GPU(s) (0: A, 1: B); a 64 MiB allocation on 2 of 2"
    )
    assert mc.judge_gpus(["A"], 1, {0: "E (2)"}) == mc.Check(
        "gpus",
        "1 GPU(s) (0: A); a 64 MiB allocation on 0 of 1; GPU 0: E (2)",
        "GPU 0 of this machine cannot allocate memory (E (2)) before vLLM has started: a fault of the machine, not of the settings.",
        fresh_machine=True,
    )
    assert mc.judge_gpus(["A"], 1, None) == mc.Check("gpus", "1 GPU(s) (0: A); the allocation test could not run here, not judged")
    assert mc.judge_gpus(["A"], 1, {}) == mc.judge_gpus(["A"], 1, None)
    folder = Path("/d/models--a--b")
    assert mc.judge_disk(folder, 3 * GiB, 4 * GiB, "the container disk") == mc.Check(
        "disk",
        "3.0 GiB free at /d/models--a--b (the container disk), the model needs 4.0 GiB more",
        "The model needs 4.0 GiB more at /d/models--a--b (the container disk) and that disk has 3.0 GiB free: raise "
        "the endpoint's container disk by at least 3 GB, or attach a network volume at BASE_PATH with the space, so "
        "the download does not fill the disk.",
    )
    assert mc.judge_disk(folder, 9 * GiB, 4 * GiB, "v") == mc.Check(
        "disk", "9.0 GiB free at /d/models--a--b (v), the model needs 4.0 GiB more"
    )
    assert mc.judge_disk(folder, 1, None, "v") == mc.Check(
        "disk", "the model's size is not known (no pre-flight figure); /d/models--a--b not judged"
    )
    assert mc.judge_disk(folder, None, 1, "v") == mc.Check("disk", "the free space at /d/models--a--b could not be read; not judged")
    assert mc.judge_memory(None, 1) == mc.Check("memory", "the available memory could not be read; not judged")
    assert mc.internet() == mc.Check(
        "internet",
        "not checked: the job API answering is this worker's link to the platform, and the Hub's reachability is "
        "the pre-flight's (the SDK's connect to 8.8.8.8:53 is not made)",
    )
    assert mc.judge_gpus(None, 1, None).found == "no NVIDIA GPU listed by NVML or nvidia-smi; the GPU checks do not apply"


def test_a_disk_exactly_big_enough_passes() -> None:
    assert mc.judge_disk(Path("/d"), 5 * GiB + mc.DISK_SPARE_BYTES, 5 * GiB, "v").ok
    assert mc.DISK_SPARE_BYTES == GiB and mc.ALLOCATION_BYTES == 64 << 20


def test_the_memory_floor_zero_and_fractions() -> None:
    assert mc.min_memory_bytes({"RUNPOD_MIN_MEMORY_GB": "0"}) == 0
    assert mc.min_memory_bytes({"RUNPOD_MIN_MEMORY_GB": "1.5"}) == GiB + GiB // 2
    assert mc.judge_memory(0, 0).ok


def test_the_allocation_child_is_given_the_size_and_each_device_and_a_time_limit() -> None:
    calls: list[dict[str, Any]] = []

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append({"argv": argv, **kwargs})
        return subprocess.CompletedProcess(argv, 0, "0 ok\n2 CUDA_ERROR_ECC_UNCORRECTABLE (214)\n", "")

    assert mc.allocate_each([0, 2], run) == {0: None, 2: "CUDA_ERROR_ECC_UNCORRECTABLE (214)"}
    [call] = calls
    assert call["argv"][1] == "-c" and "cuMemAlloc_v2" in call["argv"][2]
    assert call["argv"][3:] == [str(64 << 20), "0", "2"]
    assert call["capture_output"] is True and call["text"] is True and call["timeout"] == 60.0


def test_a_child_line_without_a_reason_still_fails_the_device() -> None:
    assert mc.parse_allocations("0 \n", [0]) == {0: "failed"}
    assert mc.parse_allocations("all\n", [0]) == {0: "the CUDA driver failed"}
    assert mc.parse_allocations("  1 ok  \nnoise\n0 ok\n", [0, 1]) == {0: None, 1: None}


def test_the_gpu_check_allocates_on_the_first_devices_the_launch_uses() -> None:
    asked: list[list[int]] = []

    def allocate(indexes: Any) -> dict[int, str | None]:
        asked.append(list(indexes))
        return {i: None for i in indexes}

    mc.before_preflight({}, 1, "cuda", gpus=lambda: ["A", "B"], memory=lambda: 64 * GiB, allocate=allocate)
    mc.before_preflight({}, 2, "auto", gpus=lambda: ["A", "B"], memory=lambda: 64 * GiB, allocate=allocate)
    none = mc.before_preflight({}, 1, "auto", gpus=lambda: None, memory=lambda: 64 * GiB, allocate=allocate)
    assert asked == [[0], [0, 1]]
    assert none[1].ok and "do not apply" in none[1].found
    floor = mc.before_preflight({"RUNPOD_MIN_MEMORY_GB": "8"}, 1, "cpu", memory=lambda: 8 * GiB - 1)
    assert not floor[0].ok


def test_present_bytes_counts_files_not_links_or_folders(tmp_path: Path) -> None:
    assert mc.present_bytes(tmp_path / "absent") == 0
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"12345")
    (tmp_path / "y").write_bytes(b"12")
    (tmp_path / "link").symlink_to(tmp_path / "y")
    assert mc.present_bytes(tmp_path) == 7
    assert mc.free_bytes(tmp_path / "a" / "x") == mc.free_bytes(tmp_path) is not None


def test_the_memory_reading_without_a_cgroup_limit_is_memavailable(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 8 kB\n")
    assert mc.available_memory(str(tmp_path)) is None
    cgroup = tmp_path / "sys" / "fs" / "cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text(str(3 * GiB))
    (cgroup / "memory.current").write_text(str(4 * GiB))
    assert mc.available_memory(str(tmp_path)) == 0  # over its limit: nothing left, never negative


def test_the_passing_checks_in_full() -> None:
    assert mc.judge_memory(8 * GiB, 4 * GiB) == mc.Check("memory", "8.0 GiB available, at least 4.0 GiB wanted (RUNPOD_MIN_MEMORY_GB)")
    assert mc.judge_gpus(None, 1, None) == mc.Check("gpus", "no NVIDIA GPU listed by NVML or nvidia-smi; the GPU checks do not apply")
    cpu = mc.before_preflight({}, 1, "cpu", memory=lambda: 8 * GiB)
    assert cpu[1] == mc.Check("gpus", "ENGINE_DEVICE=cpu: the GPU checks do not apply")
    gpus = mc.before_preflight({}, 2, "auto", gpus=lambda: ["A", "B"], memory=lambda: 8 * GiB, allocate=lambda i: {j: None for j in i})
    assert gpus[1] == mc.Check("gpus", "2 GPU(s) (0: A, 1: B); a 64 MiB allocation on 2 of 2")


def test_the_disk_check_reads_the_folder_and_subtracts_what_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    folder = Path("/v/models--a--b")
    monkeypatch.setattr(mc, "present_bytes", lambda path: GiB if path == folder else 0)
    monkeypatch.setattr(mc, "free_bytes", lambda path: 10 * GiB if path == folder else 0)
    assert mc.disk_for_download(folder, 3 * GiB, "the network volume at BASE_PATH") == mc.Check(
        "disk", "10.0 GiB free at /v/models--a--b (the network volume at BASE_PATH), the model needs 2.0 GiB more"
    )
    assert mc.disk_for_download(folder, GiB, "v").found.endswith("the model needs 0.0 GiB more")
    assert mc.disk_for_download(folder, None, "v").found == "the model's size is not known (no pre-flight figure); /v/models--a--b not judged"
    monkeypatch.setattr(mc, "free_bytes", lambda path: 0)
    short = mc.disk_for_download(folder, GiB + 1, "v")
    assert short.failure is not None and "needs 0.0 GiB more" in short.failure  # 1 byte left, plus the spare


def test_the_gigabytes_asked_for_round_up() -> None:
    folder = Path("/d")
    exact = mc.judge_disk(folder, 0, 3 * 10**9 - mc.DISK_SPARE_BYTES, "v")
    above = mc.judge_disk(folder, 0, 3 * 10**9 + 1 - mc.DISK_SPARE_BYTES, "v")
    assert exact.failure is not None and "by at least 3 GB" in exact.failure
    assert above.failure is not None and "by at least 4 GB" in above.failure


def test_free_space_is_read_on_the_filesystem_that_will_hold_the_folder() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    import shutil

    assert mc.free_bytes(shm / "not-yet" / "made") == shutil.disk_usage(shm).free


def test_a_cgroup_limit_without_a_usage_figure_leaves_memavailable(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemAvailable: 4 kB\n")
    cgroup = tmp_path / "sys" / "fs" / "cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text(str(GiB))
    assert mc.available_memory(str(tmp_path)) == 4096


def test_this_machines_memory_is_read_from_its_own_proc() -> None:
    available = mc.available_memory()
    assert available is not None and available > 0


def test_memavailable_below_the_cgroups_room_is_the_figure(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text("MemAvailable: 1024 kB\n")
    cgroup = tmp_path / "sys" / "fs" / "cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text(str(3 * GiB))
    (cgroup / "memory.current").write_text(str(GiB))
    assert mc.available_memory(str(tmp_path)) == 1024 * 1024


def test_a_model_already_downloaded_needs_only_the_spare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mc, "present_bytes", lambda path: 5 * GiB)
    monkeypatch.setattr(mc, "free_bytes", lambda path: mc.DISK_SPARE_BYTES)
    assert mc.disk_for_download(Path("/v/m"), 5 * GiB, "v").ok

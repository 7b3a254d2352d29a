"""Real vLLM startup failures people posted publicly, answered by the worker's diagnosis.

The excerpts in tests/field/startup_failures/ are verbatim machine output copied from public
issue threads and pages (URL, vLLM version and backend in the manifests), across vLLM 0.6 to
0.32, V0 and V1, several backends, and wrapped the ways logs arrive (process prefixes,
timestamps, quotes, gutters, hard wraps). Each manifest row fixed its split (a third held out
by a hash of the file name) before any rule was tuned on the rest; README.md beside the corpus
records the measurements (the first held-out measurement, and a fresh batch measured unseen).

Handled right means: a memory cause is a `memory_shortfall()` with a message; memory held by
others and profiling races are named as such; a cause the user fixes with a variable is named
and its message names that variable; a negative (a fault of the host, a missing library,
unreadable model files, anything else) is never called out of memory, and a host fault is
named as one (it gets one in-place relaunch). Every row is answered: `explain` never returns
None, so no failure ends in an exit.
"""

from __future__ import annotations

import csv
import hashlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_worker.diagnosis.verdict import Failure
from vllm_worker.diagnosis import startup_errors
from vllm_worker.diagnosis.startup_errors import explain, memory_shortfall

CORPUS = Path(__file__).resolve().parents[1] / "field" / "startup_failures"
THRESHOLD = 0.95

MEMORY = {"memory_shortfall"}
NAMED = {"memory_held", "profiling_race", "host_fault"}
# label -> the words the message must contain (the variable to change, or what to change).
FIXED_BY = {
    "max_model_len_too_large": ("MAX_MODEL_LEN",),
    "bad_arguments": (),  # the variable vLLM's words point at, checked through diagnosis.variable
    "tensor_parallel": ("TENSOR_PARALLEL_SIZE",),
    "dtype_unsupported": ("DTYPE",),
    "quantization_unsupported": (),  # QUANTIZATION when set, else MODEL_NAME (another checkpoint)
    "repo_not_found": ("MODEL_NAME",),
    "gated_repo": ("HF_TOKEN",),
    "revision_not_found": ("MODEL_REVISION",),
    "unauthorized": ("HF_TOKEN",),
    "model_path_missing": ("MODEL_NAME",),
    "offline_not_cached": (),
    "hub_unreachable": ("MODEL_NAME",),
    "unsupported_architecture": ("MODEL_NAME",),
    "trust_remote_code": ("TRUST_REMOTE_CODE",),
    "disk_full": ("disk",),
}
NEGATIVE = {"host_fault", "missing_library", "config_parse", "other"}
# The collectors' label "offline_not_cached" covers "switched off" and "no connection"; the worker
# tells them apart (HF_HUB_OFFLINE is the fix of one, not of the other).
ALSO_RIGHT = {"offline_not_cached": {"hub_unreachable"}}


@dataclass(frozen=True)
class Case:
    file: str
    label: str
    url: str
    version: str
    backend: str
    split: str


def held_out(file: str) -> bool:
    return int(hashlib.sha256(file.encode()).hexdigest(), 16) % 3 == 0


def load_cases() -> list[Case]:
    cases: list[Case] = []
    for manifest in sorted(CORPUS.glob("manifest_*.tsv")):
        with manifest.open(newline="") as handle:
            for row in csv.DictReader(handle, delimiter="\t"):
                cases.append(
                    Case(row["file"], row["label"], row["url"], row["vllm_version"], row["backend"], row["split"])
                )
    return cases


CASES = load_cases()


def judge(case: Case) -> tuple[bool, str]:
    """(handled right, why not) for one excerpt."""
    text = (CORPUS / case.file).read_bytes().decode("utf-8", errors="replace")
    diagnosis = explain(Failure.of(text, exit_code=1))
    if not diagnosis.message:
        return False, "no message"
    oom = memory_shortfall(text)
    if case.label in MEMORY:
        return oom, f"not a memory shortfall: {diagnosis.kind}"
    if oom or "out of memory" in diagnosis.message.lower() and diagnosis.kind != "unknown":
        return False, f"called out of memory ({diagnosis.kind})"
    if case.label in NAMED:
        return diagnosis.kind == case.label, f"named {diagnosis.kind}"
    if case.label in NEGATIVE:
        return True, ""
    if diagnosis.kind != case.label and diagnosis.kind not in ALSO_RIGHT.get(case.label, ()):
        return False, f"named {diagnosis.kind}: {diagnosis.message[:160]}"
    words = FIXED_BY[case.label] or ((diagnosis.variable,) if diagnosis.variable else ())
    if not words:
        return False, "names no variable"
    missing = [word for word in words if word not in diagnosis.message]
    return not missing, f"message lacks {missing}: {diagnosis.message[:160]}"


def test_the_corpus_is_large_and_its_manifests_are_whole() -> None:
    assert len(CASES) >= 150, len(CASES)
    files = {path.name for path in CORPUS.glob("*.log")}
    listed = [case.file for case in CASES]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    assert set(listed) == files, (set(listed) ^ files)
    known = MEMORY | NAMED | NEGATIVE | set(FIXED_BY)
    for case in CASES:
        assert case.label in known, (case.file, case.label)
        assert case.url.startswith("http"), case.file
        assert case.split == ("heldout" if held_out(case.file) else "dev"), case.file
    assert len({case.version for case in CASES}) >= 20
    assert {"cuda", "rocm", "cpu"} <= {case.backend for case in CASES}


def test_corpus_handled_right_on_the_held_out_third_and_on_the_whole(capsys: pytest.CaptureFixture[str]) -> None:
    table: dict[str, Counter[str]] = defaultdict(Counter)
    failures: list[str] = []
    for case in CASES:
        right, why = judge(case)
        table[case.label][f"{case.split}_total"] += 1
        table[case.label][f"{case.split}_right"] += int(right)
        if not right:
            failures.append(f"{case.split:7} {case.label:25} {case.file}: {why}")
    totals: Counter[str] = Counter()
    lines = [f"{'label':26} {'dev':>9} {'held out':>9} {'all':>9}"]
    for label in sorted(table):
        row = table[label]
        totals.update(row)
        lines.append(_row(label, row))
    lines.append(_row("ALL", totals))
    with capsys.disabled():
        print("\nfield corpus, handled right / cases:\n" + "\n".join(lines))
        if failures:
            print("not handled right:\n" + "\n".join(failures))
    for split in ("heldout", "dev"):
        assert totals[f"{split}_right"] >= THRESHOLD * totals[f"{split}_total"], split
    assert totals["heldout_right"] + totals["dev_right"] >= THRESHOLD * (totals["heldout_total"] + totals["dev_total"])


def _row(label: str, row: Counter[str]) -> str:
    def cell(right: int, total: int) -> str:
        return f"{right}/{total}" if total else "-"

    return (
        f"{label:26} {cell(row['dev_right'], row['dev_total']):>9} "
        f"{cell(row['heldout_right'], row['heldout_total']):>9} "
        f"{cell(row['dev_right'] + row['heldout_right'], row['dev_total'] + row['heldout_total']):>9}"
    )


@pytest.mark.parametrize("case", [case for case in CASES if case.label in NEGATIVE], ids=lambda case: case.file)
def test_negatives_are_answered_with_vllms_own_root_line(case: Case) -> None:
    text = (CORPUS / case.file).read_bytes().decode("utf-8", errors="replace")
    diagnosis = explain(Failure.of(text, exit_code=1))
    assert diagnosis.kind in startup_errors.KINDS
    assert diagnosis.kind != "memory_shortfall"
    # The answer carries vLLM's words, not only the worker's.
    assert diagnosis.evidence or "before printing anything" in diagnosis.message

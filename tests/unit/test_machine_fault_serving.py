"""A fault of the machine while serving (issue 22, item 3): the startup's words, one restart in place, then a fresh worker.

`runtime_failure` reads a death's tail with the startup's own host-fault rules (NCCL, the driver,
ECC, a GPU fallen off the bus) and answers in the startup's words; `fresh_worker_now` is the pure
decision; the monitor's own watch-and-recover loop, over scripted dead engines, shows the order:
the first fault of the machine restarts the engine in place, the second asks for a fresh worker
through `serving.fresh_machine`'s ledger and its endpoint-wide bound (a folder of the test).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import vllm_texts as t
from tests.support.dead_engine import DeadEngine
from vllm_worker.config import settings as settings_mod
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.diagnosis import runtime, startup_errors
from vllm_worker.diagnosis.verdict import Failure
from vllm_worker.engine.ladder import Ladder
from vllm_worker.engine.launcher import Attempt
from vllm_worker.engine.monitor import EngineMonitor
from vllm_worker.serving import fresh_machine
from vllm_worker.serving.state import WorkerState

NCCL = t.NCCL_WATCHDOG_WHILE_SERVING
ENV = {"MODEL_NAME": "acme/m", "MAX_CONCURRENCY": "30"}
CORPUS = Path(__file__).resolve().parents[1] / "field" / "startup_failures"


def _serving(env: dict[str, str] = ENV, text: str = NCCL, code: int | None = 1) -> Any:
    return runtime.runtime_failure(Failure.of(text, env=env, exit_code=code))


# --- the cause, in the startup's words -------------------------------------------------------


def test_a_real_nccl_death_while_serving_is_a_fault_of_the_machine_naming_nccl() -> None:
    d = _serving()
    assert (d.kind, d.detail) == ("host_fault", "nccl")
    assert d.message == (
        "The engine exited with code 1 while serving requests because of a fault in the GPUs' communication "
        "library (NCCL), not in the settings: [E1012 22:31:23.331871748 ProcessGroupNCCL.cpp:607] [Rank 2] "
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=203441, OpType=GATHER, NumelIn=32064, "
        "NumelOut=0, Timeout(ms)=600000) ran for 600085 milliseconds before timing out."
    )
    # The same words as a failed start's: written once, in startup_errors.
    assert startup_errors.host_fault_words("nccl") in d.message
    start = startup_errors.diagnose(Failure.of(NCCL, exit_code=1))
    assert start is not None and (start.kind, start.detail) == (d.kind, d.detail)
    assert d.kind not in runtime.RUNTIME_KINDS and d.kind in startup_errors.KINDS


def _host_fault_excerpts() -> list[str]:
    files = []
    for manifest in sorted(CORPUS.glob("manifest_*.tsv")):
        with manifest.open(newline="") as handle:
            files += [row["file"] for row in csv.DictReader(handle, delimiter="\t") if row["label"] == "host_fault"]
    return files


@pytest.mark.parametrize("name", _host_fault_excerpts())
def test_every_real_fault_of_the_machine_reads_the_same_while_serving_as_at_start(name: str) -> None:
    # Real public logs (tests/field): ECC, Xid-style "fallen off the bus", drivers, NCCL, devices.
    text = (CORPUS / name).read_text(encoding="utf-8", errors="replace")
    start = startup_errors.diagnose(Failure.of(text, exit_code=1))
    d = _serving(text=text)
    if start is None or start.kind != "host_fault":
        pytest.skip("the startup's rules miss this one too (tests/unit/test_field_corpus.py counts it)")
    assert (d.kind, d.detail) == ("host_fault", start.detail)
    assert startup_errors.host_fault_words(start.detail) in d.message


def test_there_are_real_faults_of_the_machine_to_read() -> None:
    assert len(_host_fault_excerpts()) >= 20


def test_an_nccl_echo_of_an_out_of_memory_is_the_out_of_memory() -> None:
    assert _serving(text=f"{t.TORCH_OOM}\n{NCCL}").kind == "runtime_oom"


def test_a_cause_of_the_settings_named_beside_nccl_keeps_it_from_being_the_machines() -> None:
    # The startup's tiers: an NCCL line after a cause of the settings is that cause's echo.
    text = f"{t.MAX_MODEL_LEN_TOO_LARGE}\n{NCCL}"
    assert _serving(text=text).kind == "engine_died"


def test_a_death_with_no_words_of_the_machine_stays_engine_died() -> None:
    assert _serving(text="RuntimeError: boom").kind == "engine_died"


# --- the decision (pure) ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("kind", "earlier", "fresh"),
    [
        ("host_fault", [], False),  # the first fault of the machine: restarted in place
        ("host_fault", ["engine_died", "runtime_oom"], False),
        ("host_fault", ["host_fault"], True),  # the second: a fresh worker
        ("host_fault", ["host_fault", "engine_died"], True),  # the start's relaunch for one counts
        ("engine_died", ["host_fault"], False),
        ("runtime_oom", ["host_fault", "host_fault"], False),
        (None, ["host_fault"], False),
    ],
)
def test_a_fault_of_the_machine_gets_one_relaunch_in_place(kind: str | None, earlier: list[str], fresh: bool) -> None:
    assert runtime.fresh_worker_now(kind, earlier) is fresh


@pytest.mark.parametrize("kind", sorted({*startup_errors.KINDS, *runtime.RUNTIME_KINDS} - {"host_fault"}))
def test_no_other_cause_asks_whatever_came_before(kind: str) -> None:
    everything = [*startup_errors.KINDS, *runtime.RUNTIME_KINDS]
    assert runtime.fresh_worker_now(kind, everything) is False


def test_the_answer_keeps_the_cause_and_says_why_not_again_here() -> None:
    d = _serving()
    answer = runtime.machine_fault_answer(d, ["host_fault"])
    assert answer is not None and answer.startswith(d.message + " ")
    assert "not restarted here again" in answer and "fresh worker" in answer and "\n" not in answer
    assert runtime.machine_fault_answer(d, []) is None


# --- the monitor's own loop --------------------------------------------------------------------


class _Launcher:
    """Each restart comes up serving and dies the same way, or fails to start with `start_failure`."""

    count = 1

    def __init__(self, state: WorkerState, tail: str, start_failure: str | None = None) -> None:
        self.state, self.tail, self.start_failure = state, tail, start_failure
        self.told: list[str | None] = []  # what running jobs had been told when each restart began

    def attempt(self, profile, record=None, tried=()):  # type: ignore[no-untyped-def]
        self.told.append(self.state.death.sentence if self.state.death is not None else None)
        self.count += 1
        record = {"launch": self.count, **(record or {})}
        if self.start_failure is not None:
            diagnosis = startup_errors.explain(Failure.of(self.start_failure, exit_code=1))
            return Attempt("failed", record, diagnosis=diagnosis)
        return Attempt("ready", record, engine=DeadEngine(self.tail, 1))  # type: ignore[arg-type]


def _serve_until_answered(
    volume: Path, tail: str = NCCL, causes: list[str] | None = None, limit: int = 3, start_failure: str | None = None
) -> tuple[WorkerState, _Launcher, list[str]]:
    """The monitor over an engine that dies with `tail` on every launch, until it gives up; the asks it made."""
    state = WorkerState(served_model_name="m")
    # The start's launches: one failed launch for each cause given, then the ready one.
    started = [{"launch": n, "outcome": "failed", "cause": cause} for n, cause in enumerate(causes or [], 1)]
    launches = [*started, {"launch": len(started) + 1, "outcome": "ready", "profile": "as configured"}]
    state.mark_ready()
    launcher = _Launcher(state, tail, start_failure)
    asks: list[str] = []
    settings = settings_mod.load(ENV)

    def fresh_worker(sentence: str, kind: str | None) -> str:
        # The folder stands for a mounted volume here (the mount itself is test_engine_death's).
        decision = fresh_machine.answer(
            sentence, kind, limit, str(volume), lambda: asks.append(sentence), mounted=lambda _path: True
        )
        return decision.sentence

    watcher = EngineMonitor(
        type("Supervisor", (), {"stopping": False, "engine": None})(),  # type: ignore[arg-type]
        settings,
        state,
        Ladder(LaunchProfile.parse(ENV), device_total_bytes=80 * 2**30),
        launches,
        None,
        launcher=launcher,  # type: ignore[arg-type]
        fresh_machine=fresh_worker,
    )
    watcher._run(DeadEngine(tail, 1))  # type: ignore[arg-type]  # the thread's target, run here to its end
    return state, launcher, asks


def _ledger(volume: Path) -> list[dict[str, Any]]:
    path = volume / fresh_machine.STATE_FOLDER / fresh_machine.LEDGER_FILE
    return json.loads(path.read_text())["fresh_workers"] if path.exists() else []


def test_an_nccl_death_restarts_once_in_place_then_asks_for_a_fresh_worker(tmp_path: Path) -> None:
    state, launcher, asks = _serve_until_answered(tmp_path)
    cause = _serving().message
    # The first death: restarted in place, the jobs told so and the cause named.
    assert launcher.told == [f"{cause} {runtime.RESTARTING}"]
    # The second: no second restart on this machine; a fresh worker is asked for, within the bound.
    final = runtime.machine_fault_answer(_serving(), ["host_fault"])
    assert final is not None
    assert asks == [final]
    assert state.death is not None and not state.death.restarted
    assert state.fatal == state.death.sentence == fresh_machine.decide(final, "host_fault", 0, 3, str(tmp_path)).sentence
    assert "1 of at most 3 within an hour" in state.fatal and "NCCL" in state.fatal
    assert [entry["cause"] for entry in _ledger(tmp_path)] == ["host_fault"]
    assert state.deaths == 2 and state.status["causes"] == ["host_fault", "host_fault"]
    assert state.status["restarts"] == 1


def test_after_the_starts_relaunch_for_a_fault_of_the_machine_a_death_asks_at_once(tmp_path: Path) -> None:
    state, launcher, asks = _serve_until_answered(tmp_path, causes=["host_fault"])
    assert launcher.told == []  # no restart in place at all
    assert len(asks) == 1 and state.fatal is not None and "asked the platform for a fresh worker" in state.fatal


def test_a_restart_that_fails_to_start_on_a_fault_of_the_machine_asks_at_once(tmp_path: Path) -> None:
    # The GPU is gone after the death: the restart fails to start, with the startup's words for it.
    gone = "RuntimeError: No CUDA GPUs are available"
    state, launcher, asks = _serve_until_answered(tmp_path, start_failure=gone)
    assert len(launcher.told) == 1  # the one restart in place, never a second
    assert len(asks) == 1 and state.fatal is not None
    assert state.fatal.startswith("The engine stopped while serving and could not be started again: vLLM failed to start")
    assert [entry["cause"] for entry in _ledger(tmp_path)] == ["host_fault"]


def test_at_the_endpoints_bound_the_answer_says_fresh_machines_did_not_help(tmp_path: Path) -> None:
    folder = tmp_path / fresh_machine.STATE_FOLDER
    folder.mkdir()
    ledger = fresh_machine.Ledger(str(tmp_path))
    seeded = [{"at": ledger.clock() - 60 * i, "cause": "host_fault", "worker": f"w{i}"} for i in range(2)]
    ledger.path.write_text(json.dumps({"fresh_workers": seeded}))
    state, launcher, asks = _serve_until_answered(tmp_path, limit=2)
    assert len(launcher.told) == 1 and asks == []
    assert state.fatal is not None and "Fresh machines did not help" in state.fatal and "NCCL" in state.fatal
    assert _ledger(tmp_path) == seeded


def test_deaths_that_are_not_the_machines_never_ask(tmp_path: Path) -> None:
    state, launcher, asks = _serve_until_answered(tmp_path, tail="RuntimeError: boom")
    assert asks == [] and _ledger(tmp_path) == []
    assert len(launcher.told) == 3  # the restart budget, as before
    assert state.fatal is not None and "not restarted again" in state.fatal

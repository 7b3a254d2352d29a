"""The engine's compile caches on a network volume folder: where they go, the warm mark, a torn
index repaired, and a read-only or full volume answered with one warning (real filesystems)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.volumes import full_volume, network_volume, read_only_volume
from vllm_worker.engine import compile_cache

@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A filesystem mounted where BASE_PATH points, as a network volume is."""
    with network_volume(tmp_path / "volume") as mounted:
        yield mounted


ARGV = ["vllm", "serve", "org/model", "--host", "127.0.0.1", "--port", "8001", "--max-model-len", "512"]


def test_a_mounted_volume_takes_the_caches_the_user_did_not_set(volume: Path) -> None:
    setup = compile_cache.prepare(str(volume), {"TRITON_CACHE_DIR": "/mine"}, ARGV)
    root = volume / "engine-cache"
    assert setup.root == root and setup.warning is None
    assert setup.env == {
        "VLLM_CACHE_ROOT": f"{root}/vllm",
        "TORCHINDUCTOR_CACHE_DIR": f"{root}/torchinductor",
    }
    assert setup.expected == "cold"
    assert [p.name for p in root.iterdir()] == []  # the write probe leaves nothing behind


def test_no_volume_leaves_the_container_defaults(tmp_path: Path) -> None:
    setup = compile_cache.prepare(str(tmp_path / "not-mounted"), {}, ARGV)
    assert setup.root is None and setup.env == {} and setup.expected == "unknown" and setup.warning is None


def test_a_folder_that_is_not_a_mount_is_no_volume_even_with_a_warm_mark_in_it(tmp_path: Path) -> None:
    """The image's HF_HOME lies under BASE_PATH, so a download makes BASE_PATH a folder of the container."""
    marks = tmp_path / compile_cache.CACHE_FOLDER / compile_cache.MARKS_FOLDER
    marks.mkdir(parents=True)
    (marks / compile_cache.fingerprint(ARGV)).write_text("ready\n")
    setup = compile_cache.prepare(str(tmp_path), {}, ARGV)
    assert setup.root is None and setup.env == {} and setup.expected == "unknown" and setup.warning is None


def test_a_ready_start_marks_its_configuration_warm_whatever_its_port(volume: Path) -> None:
    setup = compile_cache.prepare(str(volume), {}, ARGV)
    compile_cache.record_ready(setup, ARGV, None)  # an eager start compiled nothing: no mark
    assert compile_cache.prepare(str(volume), {}, ARGV).expected == "cold"
    compile_cache.record_ready(setup, ARGV, "cold")
    other_port = [*ARGV[:-3], "9009", *ARGV[-2:]]
    assert compile_cache.prepare(str(volume), {}, other_port).expected == "warm"
    other_config = [*ARGV[:-1], "1024"]
    assert compile_cache.prepare(str(volume), {}, other_config).expected == "cold"
    # Served from a snapshot on the volume, vLLM keys its cache on the snapshot folder: another key.
    snapshot = str(volume / "hub" / "models--org--model" / "snapshots" / ("a" * 40))
    offline = compile_cache.prepare(str(volume), {}, ARGV, snapshot)
    assert offline.expected == "cold"
    compile_cache.record_ready(offline, ARGV, "cold")
    assert compile_cache.prepare(str(volume), {}, ARGV, snapshot).expected == "warm"


def test_a_torn_vllm_compile_index_is_removed_before_the_launch_with_one_line(
    volume: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rank = volume / "engine-cache" / "vllm" / "torch_compile_cache" / "0a1b" / "rank_0_0"
    whole = rank / "backbone" / "vllm_compile_cache.py"
    torn = rank / "eagle_head" / "vllm_compile_cache.py"
    whole.parent.mkdir(parents=True)
    torn.parent.mkdir(parents=True)
    index = "{\n    ((1, 8192), 0, 'inductor'): ('artifact_shape_None_subgraph_0', 'f2a9'),\n}"
    whole.write_text(index)
    torn.write_text(index[: len(index) // 2])
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        setup = compile_cache.prepare(str(volume), {}, ARGV)
    assert setup.repaired == [str(torn)]
    assert whole.exists() and not torn.exists()
    lines = [r.getMessage() for r in caplog.records if "torn" in r.getMessage()]
    assert len(lines) == 1 and str(torn) in lines[0]


def test_a_read_only_volume_keeps_the_caches_in_the_container_with_one_warning(tmp_path: Path) -> None:
    with read_only_volume(tmp_path / "volume") as volume:
        setup = compile_cache.prepare(str(volume), {}, ARGV)
    assert setup.root is None and setup.env == {}
    assert setup.warning is not None
    assert f"BASE_PATH={volume}" in setup.warning and "stay in the container" in setup.warning


def test_a_full_volume_keeps_the_caches_in_the_container_with_one_warning(tmp_path: Path) -> None:
    with full_volume(tmp_path / "volume") as volume:
        setup = compile_cache.prepare(str(volume), {}, ARGV)
    assert setup.root is None and setup.env == {}
    assert setup.warning is not None and "MiB free" in setup.warning


def test_the_release_of_vllm_is_part_of_the_warm_mark(volume: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another vLLM compiles other graphs: a mark left by the last release must not say warm."""
    setup = compile_cache.prepare(str(volume), {}, ARGV)
    compile_cache.record_ready(setup, ARGV, "cold")
    assert compile_cache.prepare(str(volume), {}, ARGV).expected == "warm"
    monkeypatch.setattr(compile_cache, "VLLM_VERSION", "0.33.0")
    assert compile_cache.prepare(str(volume), {}, ARGV).expected == "cold"


class Planned(Exception):
    """Raised by the stand-in capacity plan: the start is followed up to the plan, no further."""


@pytest.mark.parametrize("marked", [True, False])
def test_the_warm_mark_reaches_the_capacity_plan(volume: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marked: bool) -> None:
    from vllm_worker import main
    from vllm_worker.config import command, settings as settings_mod
    from vllm_worker.config.profile import LaunchProfile
    from vllm_worker.engine.launcher import Supervisor

    env = {"MODEL_NAME": "org/model", "HF_HUB_OFFLINE": "1", "BASE_PATH": str(volume), "HOME": str(tmp_path / "home")}
    settings = settings_mod.load(env)
    argv = command.build_args(LaunchProfile.parse(env), settings).argv
    if marked:
        compile_cache.record_ready(compile_cache.prepare(str(volume), env, argv), argv, "cold")
    seen: list[str] = []

    def plan(*args: object, **kwargs: str) -> None:
        seen.append(kwargs["compile_cache"])
        raise Planned

    monkeypatch.setattr(main.capacity, "startup_plan", plan)
    with pytest.raises(Planned):
        main._startup(env, main.LaunchProfile.parse(env), settings, Supervisor(settings), {}, time.monotonic())
    assert seen == ["warm" if marked else "unknown"]


def test_the_status_names_the_folder_what_was_expected_and_what_was_repaired(volume: Path) -> None:
    setup = compile_cache.prepare(str(volume), {}, ARGV)
    setup.repaired = ["x"]
    assert setup.status() == {"folder": str(volume / "engine-cache"), "expected": "cold", "repaired": ["x"], "warning": None}
    assert compile_cache.CacheSetup().status() == {"folder": None, "expected": "unknown", "repaired": [], "warning": None}


def test_the_fingerprint_leaves_out_only_the_port_and_host_in_either_spelling() -> None:
    base = ["vllm", "serve", "m", "--max-model-len", "512"]
    key = compile_cache.fingerprint(base)
    assert compile_cache.fingerprint([*base, "--port", "1", "--host", "h"]) == key
    assert compile_cache.fingerprint([*base, "--port=1", "--host=h"]) == key
    assert compile_cache.fingerprint([*base, "--port-x=1"]) != key
    assert compile_cache.fingerprint(["vllm", "serve", "m", "--max-model-len=512"]) != key  # a different argv
    assert compile_cache.fingerprint([*base, "--enforce-eager"]) != key
    assert compile_cache.fingerprint(base, "/snap") != key
    assert compile_cache.fingerprint(base, "") == key and len(key) == 32


def test_a_volume_with_too_little_space_says_how_much(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil as shutil_mod
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(compile_cache.shutil, "disk_usage", lambda path: usage(0, 0, compile_cache.MIN_FREE_BYTES - (1 << 20)))
    assert compile_cache._probe(tmp_path / "c") == "2047 MiB free, less than the 2 GiB the caches may need"
    monkeypatch.setattr(compile_cache.shutil, "disk_usage", lambda path: usage(0, 0, compile_cache.MIN_FREE_BYTES))
    assert compile_cache._probe(tmp_path / "d" / "deeper") is None and list((tmp_path / "d" / "deeper").iterdir()) == []
    assert shutil_mod is compile_cache.shutil


def test_a_probe_that_cannot_write_names_the_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert compile_cache._probe(blocker / "c") == "NotADirectoryError: Not a directory"


def test_the_fingerprint_keeps_every_word_but_the_volatile_options_wherever_they_stand() -> None:
    base = ["vllm", "serve", "m", "--max-model-len", "512"]
    key = compile_cache.fingerprint(base)
    assert compile_cache.fingerprint(["vllm", "--port=1", "serve", "m", "--max-model-len", "512"]) == key
    assert compile_cache.fingerprint(["vllm", "--port", "1", "serve", "m", "--max-model-len", "512"]) == key
    assert compile_cache.fingerprint([*base, "--host=a=b"]) == key
    assert compile_cache.fingerprint(["other", *base[1:]]) != key


def test_an_unreadable_index_is_removed_and_named(volume: Path, caplog: pytest.LogCaptureFixture) -> None:
    rank = volume / "engine-cache" / "vllm" / "torch_compile_cache" / "0a1b" / "rank_0_0" / "backbone"
    rank.mkdir(parents=True)
    index = rank / "vllm_compile_cache.py"
    index.write_bytes(b"\xff\xfe not utf-8")
    with caplog.at_level(logging.WARNING, logger="vllm_worker"):
        removed = compile_cache.repair(volume / "engine-cache" / "vllm")
    assert removed == [str(index)] and not index.exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"compile cache: removed the torn index {index} (unreadable); vLLM compiles those graphs again"
    ]
    index.write_text("{")
    with caplog.at_level(logging.WARNING, logger="vllm_worker"):
        compile_cache.repair(volume / "engine-cache" / "vllm")
    assert caplog.records[-1].getMessage().endswith("(SyntaxError); vLLM compiles those graphs again")


def test_the_warm_mark_is_one_small_file_and_a_mark_that_cannot_be_written_is_one_line(
    volume: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = compile_cache.prepare(str(volume), {}, ARGV)
    marks = volume / "engine-cache" / compile_cache.MARKS_FOLDER
    assert not marks.exists()
    compile_cache.record_ready(setup, ARGV, "warm")
    assert [p.read_text() for p in marks.iterdir()] == ["ready\n"]
    for p in marks.iterdir():
        p.unlink()
    marks.rmdir()
    marks.write_text("")  # a file where the folder goes
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        compile_cache.record_ready(setup, ARGV, "cold")
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("compile cache: could not mark the caches warm for this configuration (") and "File exists" in line
    nested = compile_cache.CacheSetup(root=volume / "a" / "b")
    compile_cache.record_ready(nested, ARGV, "cold")
    assert (volume / "a" / "b" / compile_cache.MARKS_FOLDER / compile_cache.fingerprint(ARGV)).exists()

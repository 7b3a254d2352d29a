"""An engine process that has already exited, for the monitor's own watch-and-recover loop in unit tests."""

from __future__ import annotations

from typing import Callable


class DeadEngine:
    """An engine process that has already exited with `code`, its output's tail being `tail`."""

    host, port, stopping = "127.0.0.1", 1, False

    def __init__(self, tail: str, code: int) -> None:
        self._tail, self.returncode, self.stopped = tail, code, False

    def watch(self, on_exit: Callable[[int], None]) -> None:
        on_exit(self.returncode)

    def alive(self) -> bool:
        return False

    def tail(self) -> str:
        return self._tail

    def stop(self, grace: float) -> None:
        self.stopped = True

    def kill(self) -> None:
        self.stopped = True

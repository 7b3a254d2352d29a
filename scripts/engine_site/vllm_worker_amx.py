"""Ask Linux for the AMX tile state in every Python process of the CPU engine's environment.

On an AMX CPU (Intel Sapphire Rapids and later), vLLM 0.32's CPU backend picks its AMX
attention kernels for bfloat16, but Linux (5.16+) grants a process the AMX register state
only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM). torch asks when it uses AMX itself; the
engine's worker process never did, so its first AMX instruction died of SIGILL (exit -4) and
vLLM reported "Worker proc VllmWorker-0 died unexpectedly". This hook makes torch ask as soon
as it is imported. On other CPUs torch's call returns False and changes nothing.

Installed into .venv-engine by scripts/setup.sh (with vllm_worker_amx.pth); the worker's own
environment and the GPU image never load it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any, Sequence


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != "torch":
            return None
        # Not removed here: importlib.util.find_spec("torch") asks without loading.
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_init(module: ModuleType) -> None:
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                module.cpu._init_amx()
            except Exception:  # noqa: BLE001 - an engine without it still runs on CPUs without AMX
                pass

        spec.loader.exec_module = exec_then_init  # type: ignore[method-assign]
        return spec


if not any(isinstance(finder, _AfterTorch) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AfterTorch())

"""Common GPUs and the memory vLLM sees on them, for `vllm-worker plan --gpu NAME`.

A person sizing an endpoint thinks in card names ("a 4090", "an H100"), while the
capacity plan needs bytes. The figure that matters is the total vLLM multiplies by
GPU_MEMORY_UTILIZATION: CUDA's total (torch.cuda.mem_get_info), which is NVML's
`memory.total` less what the driver reserves. The table keeps `nvidia-smi`'s
`memory.total` in MiB (the number people can check on their own card) and subtracts
one documented reservation estimate; `--gpu-memory` takes an exact figure instead.

Reservation estimate: observed differences between nvidia-smi's total and the total
vLLM logs are 0.41-0.49 GiB (RTX 4090/3090 class: 24564 MiB vs "total_gpu_memory
(23.58GiB)"; H100 80GB HBM3: 81559 MiB vs "total_gpu_memory 79.22GiB" in vLLM PR
#10511; RTX PRO 4500 Blackwell: 32623 MiB vs 33689829376 B in vLLM PR #51590), so
450 MiB is used, and a plan from a card name carries that ~50 MiB uncertainty. A card with
more memory can reserve more: an H200 read on a lent machine reserves 616 MiB (143771 MiB, CUDA
total 150109880320 B; tests/field/gpu_readings), which is why the table keeps a logged total
wherever there is one.

Where public logs show the total itself, the table keeps it (`cuda_total_gib`): torch
prints it in every out-of-memory error ("GPU 0 has a total capacity of 14.74 GiB") and
vLLM in "Free memory on device (30.76/31.36 GiB)". The figure is the most frequent one
found for the card (tests/unit/test_capacity_calibration.py uses the same figures for
boots whose log names the card but not its total).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MiB = 1 << 20
GiB = 1 << 30

# nvidia-smi memory.total minus the CUDA total, see the module docstring.
DRIVER_RESERVED_MIB = 450


@dataclass(frozen=True)
class Card:
    name: str
    smi_total_mib: int  # nvidia-smi --query-gpu=memory.total
    aliases: tuple[str, ...] = ()
    cuda_total_gib: float | None = None  # the total torch/vLLM report, where public logs show it

    @property
    def total_bytes(self) -> int:
        """The total CUDA reports (what vLLM multiplies by the utilization): as logged, else estimated."""
        if self.cuda_total_gib is not None:
            return int(self.cuda_total_gib * GiB)
        return (self.smi_total_mib - DRIVER_RESERVED_MIB) * MiB


# Cards Runpod and similar clouds rent out most, smallest first.
CARDS: tuple[Card, ...] = (
    Card("T4", 15360, ("tesla t4",), 14.74),
    Card("RTX A4000", 16376, ("a4000",)),
    Card("RTX 4080", 16376, ("geforce rtx 4080", "4080")),
    Card("RTX 4000 Ada", 20475, ("rtx 4000 ada generation", "4000 ada")),
    Card("RTX A4500", 20470, ("a4500",)),
    Card("A10G", 23028, ("a10g",), 21.98),
    Card("A10", 23028, ("a10",)),
    Card("L4", 23034, ("l4",), 21.96),
    Card("RTX 3090", 24576, ("geforce rtx 3090", "3090"), 23.69),
    Card("RTX 4090", 24564, ("geforce rtx 4090", "4090"), 23.52),
    Card("RTX A5000", 24564, ("a5000",)),
    Card("A30", 24576, ("a30",)),
    Card("RTX 5090", 32607, ("geforce rtx 5090", "5090"), 31.36),
    Card("V100 32GB", 32768, ("tesla v100 32gb", "v100")),
    Card("A100 40GB", 40960, ("a100 40gb", "a100-sxm4-40gb", "a100-pcie-40gb"), 39.49),
    Card("L40", 46068, ("l40",)),
    Card("L40S", 46068, ("l40s",)),
    Card("A40", 46068, ("a40",)),
    Card("RTX A6000", 49140, ("a6000",), 47.53),
    Card("RTX 6000 Ada", 49140, ("rtx 6000 ada generation", "6000 ada")),
    Card("A100 80GB", 81920, ("a100", "a100 80gb", "a100-sxm4-80gb", "a100 80gb pcie", "a100-sxm"), 79.15),
    Card("H100 80GB", 81559, ("h100", "h100 80gb hbm3", "h100 pcie", "h100 sxm", "h100-sxm", "h800"), 79.19),
    Card("H100 NVL", 95830, ("h100 nvl",)),
    Card("RTX PRO 6000", 97887, ("rtx pro 6000 blackwell", "pro 6000"), 94.97),
    Card("H200", 143771, ("h200", "h200 sxm", "h200 nvl"), 139.80),
    Card("B200", 183359, ("b200",)),
)


def _key(text: str) -> str:
    text = text.lower().replace("nvidia", " ").replace("geforce", " ").replace("tesla", " ")
    return re.sub(r"[\s_\-]+", " ", text).strip()


class UnknownCard(ValueError):
    """The name matches no card, or several."""


def find_card(name: str) -> Card:
    """The card called `name` (case, spaces, 'NVIDIA'/'GeForce' prefixes ignored)."""
    key = _key(name)
    if not key:
        raise UnknownCard("an empty GPU name")
    exact = [card for card in CARDS if key == _key(card.name) or key in {_key(a) for a in card.aliases}]
    if len(exact) == 1:
        return exact[0]
    partial = [card for card in CARDS if key in _key(card.name) or _key(card.name) in key]
    if len(partial) == 1:
        return partial[0]
    known = ", ".join(card.name for card in CARDS)
    if partial:
        names = ", ".join(card.name for card in partial)
        raise UnknownCard(f"GPU name {name!r} matches several cards ({names}); name one of them")
    raise UnknownCard(f"GPU name {name!r} is not in the table; use --gpu-memory (e.g. 24GiB) or one of: {known}")


def cards_with_at_least(total_bytes: int) -> list[Card]:
    """Cards whose CUDA total is at least `total_bytes`, smallest first."""
    return sorted((card for card in CARDS if card.total_bytes >= total_bytes), key=lambda c: c.total_bytes)

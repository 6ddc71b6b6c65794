"""Accelerator and cluster figures for the simulated GPU cluster (a test bed, not a claim about GPUs).

Datasheet figures come from `../shared/reference/models-and-hardware.md` (section 3): dense peaks
per precision, HBM capacity and bandwidth, NVLink per GPU and direction, eight 400 Gb/s NICs per
node (about 50 GB/s per GPU and direction). The memory a training process sees is the total
`nvidia-smi` reports (`attune.knowledge.memory_estimate.ACCELERATOR_GIB`).

The achieved fractions of those figures (GEMM efficiency, collective bus efficiency, latencies,
the host's per-kernel cost) live in `attune.sim.constants`, where each says what it was fitted to.
"""

from __future__ import annotations

from dataclasses import dataclass

from attune.core.errors import SimError
from attune.core.hardware import DENSE_PEAK_FLOPS
from attune.knowledge.memory_estimate import ACCELERATOR_GIB

GB = 1e9


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_bf16: float  # dense FLOP/s
    peak_fp8: float
    hbm_gib: float  # what a process can use (nvidia-smi total)
    hbm_bw: float  # bytes/s
    nvlink_bw: float  # bytes/s per GPU per direction, inside a node
    nic_bw: float  # bytes/s per GPU per direction, between nodes
    pcie_bw: float  # bytes/s per GPU per direction, host <-> device
    sms: int  # streaming multiprocessors (DeepEP reserves some)
    tdp_w: float

    def peak(self, precision: str) -> float:
        return self.peak_fp8 if precision == "fp8" else self.peak_bf16


def _acc(name: str, hbm_bw_tb: float, nvlink_gb: float, sms: int, tdp: float) -> Accelerator:
    peaks = DENSE_PEAK_FLOPS[name]
    return Accelerator(
        name=name,
        peak_bf16=peaks["bf16"],
        peak_fp8=peaks["fp8"],
        hbm_gib=ACCELERATOR_GIB[name.lower()],
        hbm_bw=hbm_bw_tb * 1e12,
        nvlink_bw=nvlink_gb * GB,
        nic_bw=50 * GB,  # 8 x 400 Gb/s ConnectX-7 per 8-GPU node
        pcie_bw=55 * GB,  # PCIe Gen5 x16, achieved
        sms=sms,
        tdp_w=tdp,
    )


ACCELERATORS: dict[str, Accelerator] = {
    "H100": _acc("H100", 3.35, 450, 132, 700),
    "H200": _acc("H200", 4.8, 450, 132, 700),
    "B200": _acc("B200", 8.0, 900, 148, 1000),
}
GPUS_PER_NODE = 8  # the NVLink domain of HGX/DGX H100, H200 and B200


class HardwareError(SimError, ValueError):
    pass


def accelerator(name: str) -> Accelerator:
    key = name.strip().upper()
    try:
        return ACCELERATORS[key]
    except KeyError:
        raise HardwareError(f"accelerator: expected one of {sorted(ACCELERATORS)}, got {name!r}") from None

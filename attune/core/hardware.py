"""Accelerator figures used for MFU (dense peak FLOP/s by precision) and memory checks.

Dense peaks are the ones NVIDIA's exemplar recipes use for MFU (see the models-and-hardware
reference): H100 and H200 share GH100's compute.
"""

from __future__ import annotations

TFLOPS = 1e12

DENSE_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H100": {"bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS, "fp8": 1979 * TFLOPS},
    "H200": {"bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS, "fp8": 1979 * TFLOPS},
    "B200": {"bf16": 2250 * TFLOPS, "fp16": 2250 * TFLOPS, "fp8": 4500 * TFLOPS},
    "GB200": {"bf16": 2450 * TFLOPS, "fp16": 2450 * TFLOPS, "fp8": 4900 * TFLOPS},
}


def peak_flops(accelerator: str, precision: str) -> float | None:
    """Dense peak FLOP/s of an accelerator at a precision; None where unknown (e.g. a CPU)."""
    table = DENSE_PEAK_FLOPS.get(accelerator.upper())
    if table is None:
        return None
    return table.get(precision.lower())

"""GPU models the pipeline knows by name: memory, compute capability and dense peak FLOP/s."""

from __future__ import annotations

import functools
import re

# By the name users give in cluster.gpu: memory (GB, as sold) and compute capability.
# fp8 tensor cores need compute capability 8.9 (Ada) or newer (Hopper 9.0, Blackwell 10.0).
GPUS = {
    "H200": (141, (9, 0)), "H100": (80, (9, 0)), "GH200": (96, (9, 0)), "B200": (180, (10, 0)),
    "GB200": (186, (10, 0)),
    "A100": (80, (8, 0)), "A100-40GB": (40, (8, 0)), "L40S": (48, (8, 9)), "L4": (24, (8, 9)),
    "A10": (24, (8, 6)), "V100": (32, (7, 0)),
}  # fmt: skip
FP8_CAPABILITY = (8, 9)

# Dense bf16/fp16 tensor-core peaks, TFLOP/s, by device name fragment (fp8 is twice these).
PEAK_TFLOPS = {
    "H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "GB200": 2500.0, "B200": 2250.0,
}  # fmt: skip
# Plain fp32 peaks (SXM parts; torch leaves TF32 off for matmuls, and so does this pipeline):
# train.precision=fp32 runs at these, an order of magnitude below.
FP32_PEAK_TFLOPS = {
    "H200": 67.0, "H100": 67.0, "A100": 19.5, "L40S": 91.6, "GB200": 80.0, "B200": 80.0,
}  # fmt: skip

# What the nominal sizes report as device memory (MiB); other sizes are taken as GiB.
DEVICE_MIB = {24: 24576, 40: 40960, 80: 81559, 141: 143771}
# The GPU assumed for a memory size when none is named (for its peak FLOP/s).
GPU_BY_MEMORY = {40: "A100", 80: "H100", 141: "H200"}
GIB = 2**30  # bytes


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense peak of a device (torch.cuda.get_device_name() or a cluster.gpu name) at a
    train.precision."""
    table = FP32_PEAK_TFLOPS if precision == "fp32" else PEAK_TFLOPS
    for fragment, peak in table.items():
        if fragment in device_name:
            return peak * (2 if precision == "fp8" else 1)
    return None


def model_name(name: str | None) -> str | None:
    """The GPUS key of a cluster.gpu value or of a device name as nvidia-smi or torch give it
    ("NVIDIA H100 80GB HBM3" -> H100); None when the GPU is not one of them. A device name
    matches by whole words, so that H2000 is not taken for an H200."""
    text = str(name or "").upper()
    if text in GPUS:
        return text
    words = re.split(r"[\s_-]+", text)
    return next((key for key in GPUS if key in words), None)


def memory_gb(name: str | None) -> float | None:
    known = GPUS.get(model_name(name) or "")
    return float(known[0]) if known else None


def capability(name: str | None) -> tuple[int, int] | None:
    known = GPUS.get(model_name(name) or "")
    return known[1] if known else None


def capacity_bytes(gpu_memory_gb: float) -> int:
    """What a GPU sold as `gpu_memory_gb` GB holds, as torch counts it."""
    mib = DEVICE_MIB.get(int(gpu_memory_gb)) if gpu_memory_gb == int(gpu_memory_gb) else None
    return mib * 2**20 if mib else int(gpu_memory_gb * GIB)


@functools.cache
def local_gpu() -> tuple[str, float] | None:
    """This machine's first GPU as (name, memory in GiB) from nvidia-smi, without importing
    torch (seconds, so asked once a process); None where there is none or nvidia-smi does not
    answer."""
    import subprocess

    try:
        answer = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = answer.stdout.strip().splitlines()[:1] if answer.returncode == 0 else []
    try:
        name, mib = first[0].rsplit(",", 1)
        return name.strip(), int(mib) / 1024
    except (IndexError, ValueError):
        return None

"""The GPU of a run: the one its memory checks, the planner's auto values, the expected speed
and the wall time are all made for, at launch and in `python -m pipeline.plan` alike.

cluster.gpu when given; else, with cluster.gpu_memory_gb alone, the GPU this machine reports
or the one of that memory; else the GPU nvidia-smi reports when the jobs run on this machine;
else H100 is assumed for the estimates, and nothing is refused for its memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import ClusterConfig, PipelineConfig
from pipeline.config.derived import trains_on_gpu
from pipeline.runtime import gpus


@dataclass(frozen=True)
class RunGpu:
    name: str  # a known model (gpus.GPUS) where it is one, else as given or reported
    capacity: int | None  # bytes one GPU holds, as torch counts them; None: not known
    source: str  # where it came from, for the lines that print it
    assumed: bool = False  # nothing named or found: H100 assumed for the estimates
    capability: tuple[int, int] | None = None  # compute capability; None: not a known model


def choose(cluster: ClusterConfig, detected: tuple[str, float] | None) -> RunGpu | None:
    """The GPU of a run from its cluster keys and the GPU found on this machine (`detected`:
    nvidia-smi's name and memory in GiB, None where there is none or the jobs run elsewhere);
    None when neither names one."""
    memory = cluster.gpu_memory_gb
    if cluster.gpu:
        name = gpus.model_name(cluster.gpu) or cluster.gpu
        memory = memory or gpus.memory_gb(name)
        capacity = gpus.capacity_bytes(memory) if memory else None
        return RunGpu(
            name, capacity, f"cluster.gpu={cluster.gpu}", capability=gpus.capability(name)
        )
    if memory:
        found = detected[0] if detected else gpus.GPU_BY_MEMORY.get(int(memory))
        name = gpus.model_name(found) or found or f"a {memory:g} GB GPU"
        source = f"cluster.gpu_memory_gb={memory:g}"
        return RunGpu(name, gpus.capacity_bytes(memory), source, capability=gpus.capability(name))
    if detected:
        device, memory_gib = detected
        name = gpus.model_name(device) or device
        source = f"this machine's {device}"
        return RunGpu(name, int(memory_gib * gpus.GIB), source, capability=gpus.capability(name))
    return None


# What the estimates of a GPU run that names no GPU and finds none here are made for
ASSUMED = RunGpu(
    "H100",
    gpus.capacity_bytes(80),
    "assumed: no cluster.gpu",
    assumed=True,
    capability=gpus.capability("H100"),
)


def detected(cfg: PipelineConfig) -> tuple[str, float] | None:
    """This machine's GPU when the training job runs on it (not on Slurm's nodes)."""
    if cfg.cluster.executor == "slurm" or not trains_on_gpu(cfg):
        return None
    return gpus.local_gpu()


def of(cfg: PipelineConfig) -> RunGpu | None:
    """The GPU of this run; H100 assumed for a GPU run that names none and finds none here;
    None for a CPU run that names none."""
    gpu = choose(cfg.cluster, detected(cfg))
    return ASSUMED if gpu is None and trains_on_gpu(cfg) else gpu

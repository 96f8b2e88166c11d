"""The machine a throughput estimate is made for: a GPU's dense peaks and memory bandwidth, and
the fabric between GPUs (NVLink inside an NVLink domain, the network beyond it), as presets by
GPU name that cluster.* keys override.

Figures are the vendors' data-sheet values for the SXM parts: dense (not sparse) tensor-core
peaks, HBM bandwidth, NVLink bandwidth per GPU and direction, one 400 Gb/s NIC per GPU (an
NDR InfiniBand or Spectrum-X DGX/HGX node; Selene's A100 nodes had 200 Gb/s HDR). The PCIe
cards (L40S, L4, A10) have no NVLink: their GPUs talk over PCIe Gen4 x16 (32 GB/s per direction)
and a 200 Gb/s NIC each; V100 nodes (DGX-1, NVLink 2) had 100 Gb/s EDR InfiniBand.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.config import PipelineConfig
from pipeline.runtime import gpus


@dataclass(frozen=True)
class Hardware:
    name: str
    bf16_tflops: float  # dense bf16/fp16 tensor-core peak; fp8 is twice this where supported
    fp8: bool  # fp8 tensor cores
    hbm_gbps: float  # memory bandwidth, GB/s
    nvlink_gbps: float  # NVLink bandwidth per GPU and direction, GB/s
    network_gbps: float  # network bandwidth per GPU and direction, GB/s
    nvlink_domain: int  # GPUs joined by NVLink (a node; 72 in a GB200 NVL72 rack)
    latency_us: float = 10.0  # one collective's fixed cost inside the domain

    def peak_tflops(self, precision: str) -> float:
        return self.bf16_tflops * (2 if precision == "fp8" and self.fp8 else 1)


PRESETS = {
    "A100": Hardware("A100", 312.0, False, 2039.0, 300.0, 25.0, 8),
    "A100-40GB": Hardware("A100-40GB", 312.0, False, 1555.0, 300.0, 25.0, 8),
    "H100": Hardware("H100", 989.0, True, 3350.0, 450.0, 50.0, 8),
    "H200": Hardware("H200", 989.0, True, 4800.0, 450.0, 50.0, 8),
    # a quad-GH200 node: four superchips joined by NVLink, one 200 Gb/s NIC each
    "GH200": Hardware("GH200", 989.0, True, 4000.0, 150.0, 25.0, 4),
    "B200": Hardware("B200", 2250.0, True, 8000.0, 900.0, 50.0, 8),
    # GB200 NVL72: 72 GPUs in one NVLink domain, four to a compute tray
    "GB200": Hardware("GB200", 2500.0, True, 8000.0, 900.0, 50.0, 72),
    "L40S": Hardware("L40S", 362.0, True, 864.0, 32.0, 25.0, 8),
    "L4": Hardware("L4", 121.0, True, 300.0, 32.0, 25.0, 8),
    "A10": Hardware("A10", 125.0, False, 600.0, 32.0, 25.0, 8),
    "V100": Hardware("V100", 125.0, False, 900.0, 150.0, 12.5, 8),  # fp16 tensor cores
}
DEFAULT_GPU = "H100"
NODE = 8  # GPUs of an HGX/DGX node


def preset(name: str | None) -> Hardware:
    """The preset of a GPU name (cluster.gpu or a device name); for a GPU without one, H100's
    figures under a name that says so, so that no line names a GPU it was not estimated for."""
    known = gpus.model_name(name)
    if known in PRESETS:
        return PRESETS[known]
    if not name:
        return PRESETS[DEFAULT_GPU]
    return replace(PRESETS[DEFAULT_GPU], name=f"{name} (with {DEFAULT_GPU}'s figures)")


def of(cfg: PipelineConfig, name: str | None = None) -> Hardware:
    """The GPUs and fabric of the config's cluster: the preset of cluster.gpu (or `name`), with
    the cluster.* values that override it."""
    c = cfg.cluster
    hw = preset(name or c.gpu)
    domain = c.nvlink_domain
    if not domain and c.gpus_per_node > 0 and hw.nvlink_domain <= NODE:
        domain = c.gpus_per_node  # NVLink ends at the node (a rack-wide domain does not)
    overrides = {
        "bf16_tflops": c.peak_tflops,
        "hbm_gbps": c.hbm_gbps,
        "nvlink_gbps": c.nvlink_gbps,
        "network_gbps": c.network_gbps,
        "nvlink_domain": domain,
    }
    return replace(hw, **{key: value for key, value in overrides.items() if value})

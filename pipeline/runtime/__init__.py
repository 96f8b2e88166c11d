"""The machine a job runs on: torch.distributed from the launcher's environment, the device
(and megatron-core's CUDA-only calls mapped to the CPU for CPU jobs), known GPU models."""

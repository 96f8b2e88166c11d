"""Training: the engine (distributed set-up, model chunks, megatron-core's schedules), the
loop with validation and the best checkpoint kept, checkpoints, resume, signals, profiling."""

"""The model: megatron-core's GPTModel from the config (spec), the sizes and parameter counts
of its shape, its training FLOPs, the distributed checkpoint format of its weights, and the
hardware backends it runs on."""

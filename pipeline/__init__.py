"""GPT pretraining on Slurm clusters with megatron-core: tokenize, train, evaluate."""

__version__ = "0.1.0"

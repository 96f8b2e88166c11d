"""GPT pretraining on Slurm clusters with megatron-core: tokenize, train, evaluate."""

import warnings

__version__ = "0.1.0"

# megatron-core warns at import, in every process, that optional accelerators are absent;
# the backends say what they use instead.
warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).*not installed.*")
warnings.filterwarnings("ignore", message=r"full scope is deprecated")

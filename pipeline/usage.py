"""`--help` of the command lines: what each does, the config groups and the keys most runs
change, with examples. Hydra's own help (its generic text and the whole config) stays behind
`--hydra-help`; `--cfg job` prints the composed config."""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.config import PipelineConfig, keys
from pipeline.config.compose import CONF

USAGE = {
    "pipeline": (
        "python -m pipeline [-q] [KEY=VALUE ...]   (make pretrain ARGS='KEY=VALUE ...')",
        "Tokenize, train and evaluate: runs each step here (cluster=local) or submits them to\n"
        "Slurm as jobs chained by afterok (cluster=slurm, the default where Slurm answers). A\n"
        "rerun with the same workdir resumes, continues or refuses; it never reuses what was\n"
        "made with other settings.",
        [
            "python -m pipeline cluster=local                      # CPU, built-in corpus, tiny model",
            "python -m pipeline data=jsonl 'data.inputs=[/data/*.jsonl.gz]' model=gpt-350m train=gpu",
            "python -m pipeline workdir=runs/a train.steps=4000     # continue a run to more steps",
            "python -m pipeline -m train.micro_batch_size=4,8       # a sweep, one run folder each",
        ],
    ),
    "pipeline.plan": (
        "python -m pipeline.plan [KEY=VALUE ...] [--search] [--gpu-memory GB] [--gpus N]\n"
        "                        [--gpu NAME] [--tokens N] [--mfu F] [--json]\n"
        "       python -m pipeline.plan --validate",
        "The plan of a run by arithmetic alone, before anything is submitted: parameters, FLOPs,\n"
        "memory per GPU, tokens and epochs, the layout's expected speed and wall time; --search\n"
        "ranks the parallel layouts that fit --gpu-memory on --gpus GPUs; --json prints the layout\n"
        "and its estimate as one JSON object; --validate compares the throughput model with\n"
        "published runs (exit 1 if it misses its bounds).",
        [
            "python -m pipeline.plan model=gpt-1.3b train=gpu --gpu H100 --gpus 8 --search",
            "python -m pipeline.plan model=gpt-2.7b --gpu-memory 80 --tokens 50B",
            "python -m pipeline.plan model=gpt-1.3b train=gpu cluster.nodes=4 cluster.gpus_per_node=8 "
            "--gpu H100 --json",
        ],
    ),
    "pipeline.status": (
        "python -m pipeline.status workdir=DIR [KEY=VALUE ...]   (make status)",
        "Each step's state in a run folder (complete, running, failed, what a rerun would do),\n"
        "from its markers and Slurm; overrides show what a rerun with them would do. Exits 1\n"
        "when a step failed or would be refused, 2 when the folder holds no run.",
        [
            "python -m pipeline.status workdir=runs/gpt-125m",
            "python -m pipeline.status workdir=runs/a train.steps=8000",
        ],
    ),
    "pipeline.export": (
        "python -m pipeline.export workdir=DIR [eval.checkpoint=best|latest|PATH] [out=DIR]\n"
        "                          [export.dtype=bf16|fp32|fp16]",
        "A run's checkpoint (the best, by default) as a Hugging Face model folder with its\n"
        "tokenizer, on this machine's CPU: LlamaForCausalLM or GPT2LMHeadModel, safetensors\n"
        "shards, tokenizer.json giving the pipeline's token ids. Written to WORKDIR/export\n"
        "unless out=DIR; stages=[tokenize,train,evaluate,export] does it as the run's last job.",
        [
            "python -m pipeline.export workdir=runs/gpt-1.3b",
            "python -m pipeline.export workdir=runs/a eval.checkpoint=latest out=/models/a",
        ],
    ),
    "pipeline.step": (
        "python -m pipeline.step STEP [KEY=VALUE ...]",
        "One step of a run by hand (what a Slurm job runs): tokenizer, tokenize, verify, index,\n"
        "train, evaluate, export; a complete step is a no-op.",
        ["python -m pipeline.step verify workdir=runs/a"],
    ),
}


def common_keys() -> str:
    """The keys most runs change (common=True on their schema fields), each with its help and
    its choices or its rule."""
    lines = []
    for leaf in keys.leaves(PipelineConfig):
        if leaf.info is None or not leaf.info.common:
            continue
        allowed = f" ({' | '.join(leaf.choices)})" if leaf.choices else ""
        rule = f" ({leaf.info.rule.says})" if leaf.info.rule else ""
        lines.append(f"  {leaf.name:<28} {leaf.info.help}{allowed}{rule}\n")
    return "".join(lines)


def groups() -> str:
    """Each config group and its options, from conf/."""
    lines = []
    for folder in sorted(p for p in Path(CONF).iterdir() if p.is_dir()):
        options = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        lines.append(f"  {folder.name + '=':<12} {options}")
    return "\n".join(lines)


def text(entry: str) -> str:
    usage, what, examples = USAGE[entry]
    example_lines = "\n".join(f"  {e}" for e in examples)
    return (
        f"usage: {usage}\n\n{what}\n\nConfig groups (GROUP=OPTION):\n{groups()}\n\n"
        f"Common keys (KEY=VALUE; the whole config: --cfg job; a key to add: +KEY=VALUE is\n"
        f"refused, every setting already exists; an entry of a mapping is set the same way:\n"
        f"cluster.env.NCCL_DEBUG=INFO):\n{common_keys()}\nExamples:\n{example_lines}\n\n"
        "Docs: README.md, docs/reliability.md. Hydra's own help: --hydra-help.\n"
    )


def answer_help(entry: str, args: list[str]) -> None:
    """Print `entry`'s help and exit when asked (-h, --help)."""
    if "--help" in args or "-h" in args:
        sys.stdout.write(text(entry))
        sys.exit(0)

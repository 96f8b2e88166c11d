"""Where each stage reads and writes inside the run's workdir: one place for every path."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @classmethod
    def of(cls, workdir: str) -> RunLayout:
        return cls(Path(workdir).expanduser().resolve())

    @property
    def config(self) -> Path:
        """The resolved config of the latest launch, read back by `pipeline.status`."""
        return self.root / "config.yaml"

    @property
    def jobs(self) -> Path:
        """Slurm job ids of every submission, newest last."""
        return self.root / "jobs.json"

    # tokenize stage
    @property
    def corpus_dir(self) -> Path:
        return self.root / "corpus"

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    @property
    def tokenizer_model(self) -> Path:
        return self.tokenizer_dir / "tokenizer.model"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def shard_prefix(self, index: int) -> Path:
        return self.data_dir / f"shard-{index:05d}"

    @property
    def manifest(self) -> Path:
        return self.data_dir / "manifest.json"

    # train stage
    @property
    def index_cache(self) -> Path:
        """megatron-core's dataset index cache for this run's splits (its own, also when the
        data folder is shared with other runs: the cache depends on the training config)."""
        return self.root / "index-cache"

    @property
    def index_done(self) -> Path:
        return self.index_cache / "DONE.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def train_dir(self) -> Path:
        return self.root / "train"

    @property
    def metrics(self) -> Path:
        return self.train_dir / "metrics.jsonl"

    @property
    def train_done(self) -> Path:
        return self.train_dir / "DONE.json"

    @property
    def tensorboard(self) -> Path:
        return self.train_dir / "tensorboard"

    # evaluate stage
    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def eval_done(self) -> Path:
        return self.eval_dir / "DONE.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

"""Where each step reads and writes inside the run folder (`workdir`): one place for every path
that more than one module knows. (Inside a checkpoint folder, the names are those of
pipeline.training.checkpoint.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_TRACKER = "latest.txt"  # names the newest complete checkpoint
BEST_CHECKPOINT = "best.json"  # names the one with the lowest validation loss


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @classmethod
    def of(cls, workdir: str | Path) -> RunPaths:
        return cls(Path(workdir).expanduser().resolve())

    @property
    def config(self) -> Path:
        """The resolved config of the latest launch, read back by `pipeline.status`."""
        return self.root / "config.yaml"

    @property
    def plan(self) -> Path:
        """The plan of the latest launch that trains (pipeline.planning.run_plan), read by the
        report; no step's completion or rerun verdict depends on it."""
        return self.root / "plan.json"

    @property
    def lock(self) -> Path:
        """Held by the one launcher working on this run folder."""
        return self.root / "pipeline.lock"

    @property
    def runs(self) -> Path:
        """One record per launch: the overrides the run's outputs are made with, and what each
        step did (pipeline.orchestration.history)."""
        return self.root / "runs.jsonl"

    @property
    def replaced(self) -> Path:
        """Outputs moved aside by force=STEP, one folder a launch."""
        return self.root / "replaced"

    def failure(self, step: str) -> Path:
        """Why the step failed when it last ran here (local executors; Slurm keeps its own)."""
        return self.logs / f"{step}.failed.json"

    @property
    def jobs(self) -> Path:
        """Slurm job ids of every submission, newest last."""
        return self.root / "jobs.json"

    @property
    def sweep_point(self) -> Path:
        """In a sweep point's run folder (<workdir>/sweep/<point>): its overrides."""
        return self.root / "sweep_point.json"

    @property
    def tracking(self) -> Path:
        """The tracker runs (W&B, MLflow) this run folder continues (pipeline.tracking)."""
        return self.root / "tracking.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def job_logs(self, step: str) -> Path:
        """submitit's folder for a step's jobs (%j: the job id)."""
        return self.logs / "jobs" / step / "%j"

    # tokenize stage
    @property
    def corpus_dir(self) -> Path:
        return self.root / "corpus"

    @property
    def builtin_corpus(self) -> Path:
        return self.corpus_dir / "builtin.jsonl"

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    @property
    def tokenizer_model(self) -> Path:
        return self.tokenizer_dir / "tokenizer.model"

    @property
    def tokenizer_meta(self) -> Path:
        """What the tokenizer step recorded; its completion marker."""
        return self.tokenizer_dir / "tokenizer.json"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def shard_plan(self) -> Path:
        return self.data_dir / "plan.json"

    def shard_marker(self, index: int) -> Path:
        return self.data_dir / f"shard-{index:05d}.done.json"

    def split_dir(self, split: str, source: str) -> Path:
        """The indexed datasets of one split of one source: data/<split>/<source>/."""
        return self.data_dir / split / source

    def shard_prefix(self, index: int, split: str, source: str) -> Path:
        """What shard `index` holds of one split of one source (.bin, .idx, .digests)."""
        return self.split_dir(split, source) / f"shard-{index:05d}"

    def dedup_prefix(self, index: int, split: str, source: str) -> Path:
        """data.dedup=exact: a shard's file without the documents seen earlier in the corpus."""
        return self.split_dir(split, source) / f"dedup-{index:05d}"

    def merged_prefix(self, index: int, split: str, source: str) -> Path:
        """data.merge_into: one split of one source concatenated into fewer files."""
        return self.split_dir(split, source) / f"merged-{index:05d}"

    def shard_rejects(self, index: int) -> Path:
        return self.data_dir / "rejects" / f"shard-{index:05d}.jsonl"

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
    def checkpoint_tracker(self) -> Path:
        return self.checkpoints / CHECKPOINT_TRACKER

    def latest_checkpoint(self) -> str | None:
        """The folder name latest.txt gives the newest complete checkpoint; None before the first
        save, or when it cannot be read. Every reader of the tracker goes through here."""
        try:
            return self.checkpoint_tracker.read_text().strip() or None
        except OSError:
            return None

    @property
    def best_checkpoint_record(self) -> Path:
        return self.checkpoints / BEST_CHECKPOINT

    @property
    def train_dir(self) -> Path:
        return self.root / "train"

    @property
    def train_config(self) -> Path:
        """The config the training job ran with (the whole run's is config.yaml)."""
        return self.train_dir / "config.yaml"

    @property
    def profile(self) -> Path:
        """train.profile_steps: device time by kernel."""
        return self.train_dir / "profile.txt"

    @property
    def metrics(self) -> Path:
        return self.train_dir / "metrics.jsonl"

    @property
    def ranks(self) -> Path:
        """Where each rank of each training attempt ran (node, local rank, layout coordinates)."""
        return self.train_dir / "ranks.json"

    @property
    def progress(self) -> Path:
        """Each training rank's last phase and step, one small file a rank (the hang watchdog)."""
        return self.train_dir / "progress"

    @property
    def failures_log(self) -> Path:
        """One line for each fault a training attempt ended with: kind, ranks, nodes, cost."""
        return self.train_dir / "failures.jsonl"

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
    def eval_sets(self) -> Path:
        """Extra evaluation sets, tokenized at evaluation time."""
        return self.eval_dir / "sets"

    @property
    def eval_done(self) -> Path:
        return self.eval_dir / "DONE.json"

    # downstream tasks (eval.harness_tasks): each scored checkpoint's result, by its name
    @property
    def downstream_dir(self) -> Path:
        return self.eval_dir / "downstream"

    def downstream_result(self, checkpoint: str) -> Path:
        """What score_checkpoint wrote of checkpoint `checkpoint` (iter_0000200.json)."""
        return self.downstream_dir / f"{checkpoint}.json"

    def downstream_failure(self, checkpoint: str) -> Path:
        """Why the last scoring of `checkpoint` failed (what `make status` shows)."""
        return self.downstream_dir / f"{checkpoint}.failed.json"

    @property
    def downstream_done(self) -> Path:
        """The downstream step's marker: the checkpoints it scored after training."""
        return self.downstream_dir / "DONE.json"

    def downstream_log(self, checkpoint: str) -> Path:
        """The log of the local job that scores `checkpoint` while training goes on."""
        return self.logs / "jobs" / "downstream" / f"{checkpoint}.log"

    # export stage: a Hugging Face model folder (export.out elsewhere), export.json written last
    @property
    def export_dir(self) -> Path:
        return self.root / "export"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

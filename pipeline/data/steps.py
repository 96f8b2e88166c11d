"""The data steps of a run, each a job of its own on a cluster:

    tokenizer  the run's sentencepiece model          tokenizer/tokenizer.json
    tokenize   an array, one task per shard             data/shard-NNNNN.done.json
    verify     every shard checked, the manifest        data/manifest.json
    index      megatron-core's dataset index cache      index-cache/DONE.json (train stage)

Each checks its own completion marker (right of each name) and returns what it records.
None of them imports torch: a tokenize-only run pays no seconds of start-up for it.
"""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.core.steps import Placement
from pipeline.data import index_cache, shards, tokenize, tokenizer, verify


class TokenizerStep:
    name = "tokenizer"
    placement = Placement.CPU

    def is_complete(self, cfg: PipelineConfig) -> bool:
        paths = RunPaths.of(cfg.workdir)
        return paths.tokenizer_meta.exists() and paths.tokenizer_model.exists()

    def run(self, cfg: PipelineConfig) -> tokenizer.TokenizerRecord:
        if self.is_complete(cfg):
            return files.read_json(RunPaths.of(cfg.workdir).tokenizer_meta)
        return tokenizer.provide(cfg)


class TokenizeStep:
    name = "tokenize"
    placement = Placement.ARRAY

    def prepare(self, cfg: PipelineConfig) -> None:
        tokenize.prepare(cfg)

    def tasks(self, cfg: PipelineConfig) -> int:
        planned = shards.planned_count(RunPaths.of(cfg.workdir))
        return cfg.data.num_shards if planned is None else planned  # at most that many

    def is_complete(self, cfg: PipelineConfig) -> bool:
        paths = RunPaths.of(cfg.workdir)
        planned = shards.planned_count(paths)
        return planned is not None and all(
            tokenize.is_shard_complete(paths, i) for i in range(planned)
        )

    def run_task(self, cfg: PipelineConfig, index: int) -> tokenize.ShardRecord:
        return tokenize.run_task(cfg, index)

    def run(self, cfg: PipelineConfig) -> list[tokenize.ShardRecord]:
        self.prepare(cfg)
        return [self.run_task(cfg, i) for i in range(self.tasks(cfg))]


class VerifyStep:
    name = "verify"
    placement = Placement.CPU

    def is_complete(self, cfg: PipelineConfig) -> bool:
        return RunPaths.of(cfg.workdir).manifest.exists()

    def run(self, cfg: PipelineConfig) -> verify.Manifest:
        if self.is_complete(cfg):
            return files.read_json(RunPaths.of(cfg.workdir).manifest)
        return verify.verify(cfg)


class IndexStep:
    name = "index"
    placement = Placement.CPU

    def is_complete(self, cfg: PipelineConfig) -> bool:
        """Built for this config: another sequence length, seed or sample count rebuilds it."""
        return index_cache.is_built(cfg)

    def run(self, cfg: PipelineConfig) -> index_cache.IndexRecord:
        if self.is_complete(cfg):
            return files.read_json(RunPaths.of(cfg.workdir).index_done)
        return index_cache.build(cfg)


TOKENIZER = TokenizerStep()
TOKENIZE = TokenizeStep()
VERIFY = VerifyStep()
INDEX = IndexStep()

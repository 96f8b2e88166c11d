"""The data steps of a run, each a job of its own on a cluster:

    tokenizer  the run's sentencepiece model          tokenizer/tokenizer.json
    tokenize   an array, one task per shard             data/shard-NNNNN.done.json
    verify     every shard checked; duplicates removed  data/manifest.json
               and files merged if asked
    index      megatron-core's dataset index cache      index-cache/DONE.json (train stage)

Each checks its own completion marker (right of each name; pipeline.core.steps.MarkedStep),
which records what the output was made from (pipeline.core.provenance); a complete output made from other settings is not
reused: the data is refused (it defines everything after it), the index cache rebuilt.
None of them imports torch: a tokenize-only run pays no seconds of start-up for it.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.core import files, provenance
from pipeline.core.paths import RunPaths
from pipeline.core.provenance import MadeFrom
from pipeline.core.steps import ArrayStep, Change, MarkedStep, Placement
from pipeline.data import index_cache, shards, sources, tokenize, tokenizer, verify


def data_paths(cfg: PipelineConfig) -> RunPaths:
    """Where the run's tokenized data is: its own folder, or the run data.prepared names."""
    return RunPaths.of(cfg.data.prepared or cfg.workdir)


class TokenizerStep(MarkedStep):
    """Refused when changed: the tokenizer defines every token of the data."""

    name = "tokenizer"
    placement = Placement.CPU

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        return provenance.made_from(tokenizer.settings(data_paths(cfg), cfg))

    def marker(self, cfg: PipelineConfig) -> Path:
        return data_paths(cfg).tokenizer_meta

    def is_complete(self, cfg: PipelineConfig) -> bool:
        return data_paths(cfg).tokenizer_model.exists() and super().is_complete(cfg)

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        return [RunPaths.of(cfg.workdir).tokenizer_dir]

    def make(self, cfg: PipelineConfig, made_from: MadeFrom) -> tokenizer.TokenizerRecord:
        return tokenizer.provide(cfg, made_from)


class TokenizeStep(ArrayStep):
    """One marker per shard, each with its made-from fingerprint; refused when changed."""

    name = "tokenize"
    placement = Placement.ARRAY

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        paths = data_paths(cfg)
        d = cfg.data
        settings = {
            **sources.corpus_settings(paths, d),
            "data.num_shards": d.num_shards,
            "data.split": d.split,  # each document's split is decided as it is written
            "data.split_seed": d.split_seed,
        }
        return provenance.made_from(settings, tokenizer=TOKENIZER.fingerprint(cfg))

    def recorded(self, cfg: PipelineConfig) -> MadeFrom | None:
        paths = data_paths(cfg)
        planned = shards.planned_count(paths) or 0
        markers = (files.read_json_or_none(paths.shard_marker(i)) for i in range(planned))
        return next((m.get("made_from", {}) for m in markers if m is not None), None)

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        return [RunPaths.of(cfg.workdir).data_dir]  # the plan and the shards

    def prepare(self, cfg: PipelineConfig) -> None:
        tokenize.prepare(cfg)

    def tasks(self, cfg: PipelineConfig) -> int:
        planned = shards.planned_count(data_paths(cfg))
        return cfg.data.num_shards if planned is None else planned  # at most that many

    def is_complete(self, cfg: PipelineConfig) -> bool:
        paths = data_paths(cfg)
        planned = shards.planned_count(paths)
        made = self.fingerprint(cfg)
        return planned is not None and all(
            tokenize.is_shard_complete(paths, i, made) for i in range(planned)
        )

    def run_task(self, cfg: PipelineConfig, index: int) -> tokenize.ShardRecord:
        return tokenize.run_task(cfg, index, self.made_from(cfg))


class VerifyStep(MarkedStep):
    """Checks, deduplicates and merges the tokenized shards (pipeline.data.verify). Refused when
    changed: deduplication decides which documents are read."""

    name = "verify"
    placement = Placement.CPU

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        d = cfg.data
        settings = {"data.dedup": d.dedup, "data.merge_into": d.merge_into}
        return provenance.made_from(settings, tokenize=TOKENIZE.fingerprint(cfg))

    def marker(self, cfg: PipelineConfig) -> Path:
        return data_paths(cfg).manifest

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        paths = RunPaths.of(cfg.workdir)
        made = [p for kind in ("dedup", "merged") for p in paths.data_dir.glob(f"*/*/{kind}-*")]
        return [paths.manifest, *sorted(made)]

    def make(self, cfg: PipelineConfig, made_from: MadeFrom) -> verify.Manifest:
        return verify.verify(cfg, made_from)


class IndexStep(MarkedStep):
    name = "index"
    placement = Placement.CPU

    def made_from(self, cfg: PipelineConfig) -> MadeFrom:
        verified = VERIFY.fingerprint(cfg)
        return provenance.made_from(index_cache.settings(cfg), verify=verified)

    def marker(self, cfg: PipelineConfig) -> Path:
        return RunPaths.of(cfg.workdir).index_done

    def change(self, recorded: MadeFrom, now: MadeFrom) -> Change:
        return Change.REDO  # a cache: rebuilt for another sequence length, seed or size

    def outputs(self, cfg: PipelineConfig) -> list[Path]:
        return [RunPaths.of(cfg.workdir).index_cache]

    def make(self, cfg: PipelineConfig, made_from: MadeFrom) -> index_cache.IndexRecord:
        return index_cache.build(cfg, made_from)


TOKENIZER = TokenizerStep()
TOKENIZE = TokenizeStep()
VERIFY = VerifyStep()
INDEX = IndexStep()

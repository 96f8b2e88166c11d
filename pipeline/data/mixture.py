"""The data mixture against the training budget: each source's share of the training tokens
(its weight) and how many epochs of its training split that share is. Past data.warn_epochs a
source repeats often enough to hurt (Muennighoff et al. 2023, "Scaling Data-Constrained
Language Models": up to about four epochs are nearly as good as new data), and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import PipelineConfig
from pipeline.config.split_weights import Split
from pipeline.core import files
from pipeline.core.paths import RunPaths
from pipeline.data import estimate, sources

# How far past data.max_epochs an estimate must be for the plan to refuse the run: nearer, the
# index step's count of the tokenized data decides.
ESTIMATE_MARGIN = 1.5


@dataclass(frozen=True)
class SourceShare:
    name: str
    share: float  # of the training samples
    train_tokens: int  # in its training split
    epochs: float  # of its training split, over the whole run


def budget(cfg: PipelineConfig) -> int:
    """Tokens the whole run trains on: steps x global batch x sequence length."""
    t = cfg.train
    return t.steps * t.global_batch_size * cfg.model.seq_length


def train_tokens(manifest: dict) -> dict[str, int]:
    return {name: s["split_tokens"]["train"] for name, s in manifest["sources"].items()}


def estimated_train_tokens(cfg: PipelineConfig) -> tuple[dict[str, int], str]:
    """Before tokenizing: each source's training tokens, estimated from its content
    (pipeline.data.estimate), and how, in words."""
    found = estimate.estimate(cfg)
    train_share = Split.of(cfg.data.split).shares[0]
    return {name: int(n * train_share) for name, n in found.tokens.items()}, found.how


def shares_of(cfg: PipelineConfig, tokens: dict[str, int]) -> list[SourceShare]:
    total = budget(cfg)
    return [
        SourceShare(name, w, tokens[name], total * w / tokens[name] if tokens[name] else 0.0)
        for name, w in sources.weights(cfg.data).items()
        if name in tokens
    ]


def epoch_lines(
    cfg: PipelineConfig, tokens: dict[str, int], estimated: str | None = None
) -> list[str]:
    """What the plan prints: the budget, and for each source its share, its training tokens
    and the epochs they make; a warning for each source past data.warn_epochs. `estimated`:
    how the tokens were estimated, when they were not counted."""
    about = "~" if estimated else ""
    lines = [f"[plan] data: {budget(cfg):,} training tokens over the run"]
    if estimated:
        lines[0] += f" (sources' tokens {estimated}; the index step counts them)"
    warnings = []
    for s in shares_of(cfg, tokens):
        lines.append(
            f"[plan]   {s.name}: {100 * s.share:.1f}% of samples, {about}{s.train_tokens:,} "
            f"training tokens, {about}{s.epochs:.2f} epochs"
        )
        if s.epochs > cfg.data.warn_epochs:
            warnings.append(
                f"[plan] warning: source {s.name} is read {about}{s.epochs:.1f} times, more than "
                f"data.warn_epochs={cfg.data.warn_epochs:g}: lower its weight or add data to it"
            )
        if estimated and cfg.data.max_epochs < s.epochs <= cfg.data.max_epochs * ESTIMATE_MARGIN:
            warnings.append(
                f"[plan] warning: source {s.name} is read ~{s.epochs:.1f} times by the estimate, "
                f"more than data.max_epochs={cfg.data.max_epochs:g}; the index step refuses the "
                "run if the tokenized data confirms it"
            )
    return lines + warnings


def known_train_tokens(cfg: PipelineConfig) -> tuple[dict[str, int], str | None] | None:
    """Each source's training tokens, from the tokenized data (of this run or data.prepared),
    else estimated (with how, in words); None when an input went away (the launch refuses it
    with its own line)."""
    for run in (cfg.workdir, cfg.data.prepared):
        manifest = files.read_json_or_none(RunPaths.of(run).manifest) if run else None
        if manifest is not None and "sources" in manifest:
            return train_tokens(manifest), None
    try:
        return estimated_train_tokens(cfg)
    except OSError:
        return None


def plan_lines(cfg: PipelineConfig, known: tuple[dict[str, int], str | None] | None) -> list[str]:
    """The plan's lines on the data (`epoch_lines`) of `known_train_tokens`; none without them."""
    return [] if known is None else epoch_lines(cfg, known[0], estimated=known[1])


def too_many_epochs(
    cfg: PipelineConfig, known: tuple[dict[str, int], str | None] | None
) -> str | None:
    """Why the run would read a source more than data.max_epochs times, or None, by the
    training tokens `known` (`known_train_tokens`; None: not known). An estimate refuses only
    past ESTIMATE_MARGIN times the limit: nearer, the count decides."""
    limit = cfg.data.max_epochs * (ESTIMATE_MARGIN if known and known[1] else 1)
    for s in shares_of(cfg, known[0]) if known else []:
        if s.epochs > limit:
            about = f"~{s.epochs:,.0f} times ({known[1]})" if known[1] else f"{s.epochs:,.1f} times"
            return (
                f"train.steps: {cfg.train.steps:,} steps of {cfg.train.global_batch_size:,} "
                f"sequences read source {s.name} {about}, more than "
                f"data.max_epochs={cfg.data.max_epochs:g}; lower train.steps or "
                "train.global_batch_size, or add data"
            )
    return None

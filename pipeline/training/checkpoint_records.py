"""The checkpoints folder's records, read without torch (the launcher reads them before
anything is submitted): the newest complete checkpoint and its state, the checkpoint that
eval.checkpoint names, and whether a run can resume under another parallel layout."""

from __future__ import annotations

from pipeline.core import files, scores
from pipeline.core.paths import RunPaths

LAYOUT_KEYS = ("tensor", "pipeline", "virtual_pipeline")
# Megatron's uneven stages; a checkpoint of an earlier version holds neither: an even split
SPLIT_KEYS = ("account_for_embedding", "account_for_loss")


def tracked_state(paths: RunPaths) -> dict | None:
    """state.json of the newest checkpoint: the one latest.txt names, else (that one deleted,
    say) the newest folder with a readable one. Not verified here: a resume verifies what it
    reads."""
    latest = paths.latest_checkpoint()
    named = [paths.checkpoints / latest] if latest else []
    for folder in [*named, *sorted(paths.checkpoints.glob("iter_???????"), reverse=True)]:
        try:
            state = files.read_json_or_none(folder / "state.json")
        except ValueError:  # damaged: the resume skips it too
            continue
        if state is not None:
            return state
    return None


def chosen(paths: RunPaths, choice: str, select_by: str | None = None) -> str | None:
    """The checkpoint eval.checkpoint names, by its records (best.json, latest.txt; with
    eval.select_by, best is the best scored one) or as given; None when there is none yet. The
    evaluation verifies it before reading it."""
    if choice not in ("best", "latest"):
        return choice
    if choice == "best" and select_by:
        return scores.best(paths, select_by)
    best = files.read_json_or_none(paths.best_checkpoint_record) if choice == "best" else None
    if best is not None:
        return best["name"]
    return paths.latest_checkpoint()


def layout_problem(saved: dict | None, current: dict) -> tuple[str, str] | None:
    """(key, why) when training cannot resume from the checkpoint whose state.json is `saved`
    under the `current` layout (LAYOUT_KEYS, SPLIT_KEYS, backend, padded_vocab_size). Its weights and
    optimizer state are sharded by megatron-core's distributed format, so they load under any
    tensor, pipeline and data-parallel layout, unless the layout pads the vocabulary to another
    size (the embedding's shape), another backend would read the optimizer state (its format),
    or the distributed optimizer saved its shards in place (train.reshardable_optimizer=false):
    those load under the same tensor/pipeline layout and stage split alone."""
    layout = (saved or {}).get("layout")
    if not layout:
        return None
    was = ", ".join(f"parallel.{k}={layout[k]}" for k in LAYOUT_KEYS)
    was += "".join(f", parallel.{k}=true" for k in SPLIT_KEYS if layout.get(k))
    saved_experts = layout.get("expert", 1)  # expert parallelism; 1 before MoE models
    if saved_experts != 1:
        was += f", parallel.expert={saved_experts}"
    backend, padded_vocab_size = current["backend"], current["padded_vocab_size"]
    if layout.get("backend") != backend:
        return "train.device", (
            f"the checkpoint to resume was written by the {layout.get('backend')} backend "
            f"({was}), whose optimizer state the {backend} backend does not read; resume on "
            "the same kind of device (its weights load anywhere: stages=[evaluate])"
        )
    if layout.get("padded_vocab_size") != padded_vocab_size:
        return "parallel.tensor", (
            f"the checkpoint to resume was saved under {was} with the vocabulary padded to "
            f"{layout.get('padded_vocab_size')}; this layout pads it to {padded_vocab_size} "
            "(model.make_vocab_size_divisible_by x parallel.tensor), another embedding shape; "
            "choose a tensor-parallel size that pads it the same"
        )
    changed = [k for k in LAYOUT_KEYS if layout[k] != current[k]]
    changed += [k for k in SPLIT_KEYS if layout.get(k, False) != current.get(k, False)]
    if saved_experts != current.get("expert", saved_experts):  # experts are sharded by it
        changed.append("expert")
    if layout.get("optimizer_sharding") == "dp_reshardable" and changed:
        return f"parallel.{changed[0]}", (
            f"the checkpoint to resume holds the distributed optimizer's shards as saved under "
            f"{was}, which load under that tensor/pipeline layout alone (the data-parallel "
            "size may change); resume under it, and save once with "
            "train.reshardable_optimizer=true to change it"
        )
    return None

"""Which checkpoints a training can resume from: any tensor, pipeline or data-parallel layout,
except one that pads the vocabulary to another size, a backend that writes its optimizer
state in another format, or another tensor/pipeline layout when the distributed optimizer saved
its shards in place. The states are state.json's "layout" as the trainer writes it."""

from __future__ import annotations

from pipeline.config.derived import trains_on_gpu
from pipeline.core.paths import CHECKPOINT_TRACKER, RunPaths
from pipeline.model.backends import names
from pipeline.training.checkpoint_records import chosen, layout_problem
from tests.conftest import GPU_GIVEN, make_config


def layout(backend: str = "cpu", tensor: int = 2, padded: int = 512, **more) -> dict:
    shape = {"tensor": tensor, "pipeline": 1, "virtual_pipeline": None}
    return {**shape, "padded_vocab_size": padded, "backend": backend, **more}


def state(backend: str = "cpu", tensor: int = 2, padded: int = 512, **more) -> dict:
    return {"layout": layout(backend, tensor, padded, **more)}


def test_another_tensor_pipeline_or_data_layout_resumes():
    assert layout_problem(state(tensor=2), layout(tensor=1)) is None
    assert layout_problem(None, layout()) is None  # nothing saved yet
    assert layout_problem({"step": 3}, layout(names.TRANSFORMER_ENGINE)) is None


def test_a_gpu_run_resumes_its_own_checkpoint():
    """The launcher names the backend before any GPU is there; it must be the name the GPU
    backend writes into the checkpoint's layout."""
    gpu = make_config("/tmp/unused", *GPU_GIVEN, "cluster.gpus_per_node=1")
    cpu = make_config("/tmp/unused")
    saved = state(backend=names.TRANSFORMER_ENGINE)
    assert layout_problem(saved, layout(names.for_training(trains_on_gpu(gpu)))) is None
    assert (
        layout_problem(saved, layout(names.for_training(trains_on_gpu(cpu))))[0] == "train.device"
    )


def test_another_padded_vocabulary_is_refused_naming_parallel_tensor():
    key, why = layout_problem(state(tensor=1, padded=576), layout(tensor=2, padded=768))
    assert key == "parallel.tensor" and "padded to 576; this layout pads it to 768" in why


def test_another_backend_is_refused_naming_the_device():
    key, why = layout_problem(state(backend=names.TRANSFORMER_ENGINE), layout(names.CPU))
    assert key == "train.device"
    assert why.startswith(
        "the checkpoint to resume was written by the transformer_engine backend ("
    )


def test_optimizer_shards_saved_in_place_keep_the_tensor_and_pipeline_layout():
    te = names.TRANSFORMER_ENGINE
    saved = state(te, tensor=2, optimizer_sharding="dp_reshardable")
    assert layout_problem(saved, layout(te, tensor=2)) is None  # data-parallel size is free
    key, why = layout_problem(saved, layout(te, tensor=1))
    assert key == "parallel.tensor"
    assert "save once with train.reshardable_optimizer=true" in why
    assert layout_problem(state(te, tensor=2), layout(te, tensor=1)) is None  # reshardable


def test_optimizer_shards_saved_in_place_keep_the_stage_split():
    """Under the same pipeline size, counting the embedding as a layer moves a layer off the
    first stage, and the shards saved in place with it; a record of an earlier version, with
    no split, is an even one."""
    te = names.TRANSFORMER_ENGINE
    uneven = {"pipeline": 2, "account_for_embedding": True}
    saved = state(te, optimizer_sharding="dp_reshardable", **uneven)
    assert layout_problem(saved, layout(te, **uneven)) is None
    key, why = layout_problem(saved, layout(te, pipeline=2))
    assert key == "parallel.account_for_embedding"
    assert "parallel.virtual_pipeline=None, parallel.account_for_embedding=true," in why
    earlier = state(te, optimizer_sharding="dp_reshardable", pipeline=2)
    assert layout_problem(earlier, layout(te, pipeline=2, account_for_loss=False)) is None
    assert layout_problem(state(te, **uneven), layout(te, pipeline=2)) is None  # reshardable


def test_optimizer_shards_saved_in_place_keep_the_expert_parallel_size():
    """Experts and their optimizer state are sharded over expert-parallel ranks: shards saved
    in place load under the same size alone; reshardable ones under any (CPU checkpoints)."""
    te = names.TRANSFORMER_ENGINE
    saved = state(te, optimizer_sharding="dp_reshardable", expert=2)
    assert layout_problem(saved, layout(te, expert=2)) is None
    key, why = layout_problem(saved, layout(te, expert=1))
    assert key == "parallel.expert" and "parallel.expert=2" in why
    assert layout_problem(state(te, expert=2), layout(te, expert=1)) is None  # reshardable
    assert layout_problem(state(expert=2), layout(expert=1)) is None  # CPU
    # a dense run saved before parallel.expert was recorded
    earlier = state(te, optimizer_sharding="dp_reshardable")
    assert layout_problem(earlier, layout(te, expert=1)) is None


def test_an_empty_or_missing_tracker_names_no_checkpoint(tmp_path):
    paths = RunPaths.of(tmp_path)
    assert paths.latest_checkpoint() is None and chosen(paths, "latest") is None
    paths.checkpoints.mkdir()
    (paths.checkpoints / CHECKPOINT_TRACKER).write_text("")  # cut short as it was written
    assert paths.latest_checkpoint() is None and chosen(paths, "latest") is None
    (paths.checkpoints / CHECKPOINT_TRACKER).write_text("iter_0000020\n")
    assert chosen(paths, "latest") == chosen(paths, "best") == "iter_0000020"

"""Reading and writing the two formats' files: a distributed checkpoint's weights, whole, in
one process (torch.distributed.checkpoint reassembles whatever layout wrote them), and a Hugging
Face model folder (config.json, safetensors shards and their index)."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core import files
from pipeline.core.errors import ConfigError, StageError

if TYPE_CHECKING:  # torch is imported by what reads or writes tensors, not by the launcher
    import torch

    Tensors = dict[str, torch.Tensor]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
EXPORT_RECORD = "export.json"  # an export folder's record, written last
DCP_FOLDER = "dist"  # pipeline.model.dist_checkpoint.FOLDER, without importing megatron-core
# megatron-core's description of its torch_dist format, which its loader reads first
MEGATRON_METADATA = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}


def read_checkpoint(folder: Path, keys: list[str]) -> Tensors:
    """The tensors `keys` of checkpoint `folder`, whole, in the dtype they were saved in."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    source = folder / DCP_FOLDER
    stored = dcp.FileSystemReader(str(source)).read_metadata().state_dict_metadata
    absent = [k for k in keys if not isinstance(stored.get(k), TensorStorageMetadata)]
    if absent:
        raise StageError(
            f"checkpoint {folder} holds no {absent[0]}: it was written for another model shape "
            "than the run's model.* settings"
        )
    wanted = {k: torch.empty(stored[k].size, dtype=stored[k].properties.dtype) for k in keys}
    with _one_process():
        dcp.load(wanted, storage_reader=dcp.FileSystemReader(str(source)), no_dist=True)
    return wanted


@contextlib.contextmanager
def _one_process() -> Iterator[None]:
    """torch.distributed.checkpoint warns that it assumes one process; here it is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def write_checkpoint(folder: Path, tensors: Tensors) -> None:
    """`tensors` as a distributed checkpoint of one whole shard each, which megatron-core's
    loader reads into any layout (it reshards on load, as from any checkpoint)."""
    import torch
    import torch.distributed.checkpoint as dcp

    target = folder / DCP_FOLDER
    target.mkdir(parents=True, exist_ok=True)
    with _one_process():
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(target)), no_dist=True)
    torch.save({}, target / "common.pt")
    files.write_json(target / "metadata.json", MEGATRON_METADATA)


def write_model(
    out: Path, config: dict[str, Any], tensors: Tensors, dtype: torch.dtype, shard_bytes: int
) -> None:
    """A Hugging Face model folder: config.json, the tensors in `dtype` as safetensors shards of
    at most `shard_bytes` (one tensor may exceed it) and their index."""
    from safetensors.torch import save_file

    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * dtype.itemsize
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    weight_map = {}
    for number, names in enumerate(shards, 1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        with files.atomic_path(out / file) as tmp:
            save_file(
                {n: tensors[n].to(dtype).contiguous() for n in names},
                str(tmp),
                metadata={"format": "pt"},
            )
            os.chmod(tmp, 0o666 & ~files.umask())  # safetensors writes it anew, private
        weight_map.update(dict.fromkeys(names, file))
    total = sum(t.numel() * dtype.itemsize for t in tensors.values())
    files.write_json(out / INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map})
    files.write_json(out / "config.json", config)


def read_config(folder: Path) -> dict[str, Any]:
    """config.json of a Hugging Face model folder, or ConfigError naming model.init_from."""
    path = folder / "config.json"
    if not folder.is_dir():
        raise ConfigError(f"model.init_from={folder}: no such folder")
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"model.init_from={folder}: no config.json there (a Hugging Face model folder holds "
            "config.json and model*.safetensors)"
        ) from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"model.init_from: {path}:{e.lineno}: not JSON ({e.msg})") from None


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a Hugging Face model folder: those its index names, or its one
    model.safetensors."""
    index = folder / INDEX
    if index.exists():
        names = sorted(set(files.read_json(index)["weight_map"].values()))
        return [folder / n for n in names]
    if (folder / SINGLE).exists():
        return [folder / SINGLE]
    raise ConfigError(
        f"model.init_from={folder}: no {SINGLE} or {INDEX} there (only safetensors weights "
        "are read; pytorch_model.bin is not)"
    )


def read_model(folder: Path, names: list[str]) -> Tensors:
    """The tensors `names` of a Hugging Face model folder, or StageError naming the first
    that is not there."""
    from safetensors import safe_open

    found: Tensors = {}
    for path in weight_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in set(f.keys()) & set(names):
                found[name] = f.get_tensor(name)
    absent = [n for n in names if n not in found]
    if absent:
        raise StageError(
            f"model.init_from={folder}: its weights hold no {absent[0]} ({len(absent)} tensors "
            "of this model are missing)"
        )
    return found


def shape(folder: Path, name: str) -> list[int] | None:
    """The shape of tensor `name` in a Hugging Face model folder, read from the safetensors
    headers alone; None when no file holds it."""
    from safetensors import safe_open

    for path in weight_files(folder):
        with safe_open(str(path), framework="pt") as f:
            if name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                return list(f.get_slice(name).get_shape())
    return None


def refuse_foreign(out: Path) -> None:
    """An export replaces only an earlier export: a folder without its record may be anyone's."""
    if out.exists() and not (out / EXPORT_RECORD).exists() and any(out.iterdir()):
        raise ConfigError(
            f"export.out={out}: the folder exists and holds no {EXPORT_RECORD}, so it is not an "
            "export this pipeline made; name a new folder"
        )


def identity(folder: Path) -> dict[str, Any]:
    """What a run started from `folder` records of it: its config.json's digest and each weight
    file's name, size and modification time (reading every byte of many GB at each launch
    would cost more than it tells)."""
    stat = {p.name: [os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in weight_files(folder)}
    return {
        "path": str(folder.resolve()),
        "config": files.sha256(folder / "config.json"),
        "weights": stat,
    }

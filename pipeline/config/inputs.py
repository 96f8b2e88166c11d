"""The files an input glob names: files as they are, and a folder that `datasets.save_to_disk`
wrote (state.json beside its Arrow files) as its Arrow files, in the order state.json lists."""

from __future__ import annotations

import glob
import json
import os

from pipeline.core.errors import ConfigError


def dataset_files(folder: str) -> list[str] | None:
    """The Arrow files of a saved `datasets` folder, or None for any other folder."""
    state = os.path.join(folder, "state.json")
    if not os.path.isfile(state):
        return None
    try:
        with open(state) as f:
            listed = [entry["filename"] for entry in json.load(f)["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [os.path.join(folder, name) for name in listed]


def expand(pattern: str) -> tuple[list[str], list[str]]:
    """(files, other folders) that a glob names; saved datasets become their Arrow files."""
    found, folders = [], []
    for path in glob.glob(os.path.expanduser(pattern)):
        if os.path.isfile(path):
            found.append(path)
        elif os.path.isdir(path):
            inside = dataset_files(path)
            if inside is None:
                folders.append(path)
            else:
                found.extend(inside)
    return found, folders


def identity(path: str) -> tuple[int, int]:
    """A file's real identity (device, inode): one for all its names, whether symlinks, hard
    links or two globs reach it."""
    found = os.stat(path)
    return found.st_dev, found.st_ino


def readable_files(pattern: str, key: str) -> list[str]:
    """The files a glob of `key` names (a saved `datasets` folder: its Arrow files); none, or
    one that cannot be read, is a ConfigError."""
    matches, folders = expand(pattern)
    if not matches and folders:
        raise ConfigError(
            f"{key}: {pattern!r} is a folder; name its files with a glob ({pattern.rstrip('/')}"
            "/*.jsonl, say)"
        )
    if not matches:
        raise ConfigError(f"{key}: {pattern!r} matches no file")
    for path in matches:
        if not os.access(path, os.R_OK):
            raise ConfigError(f"{key}: {path} is not readable")
    return [os.path.abspath(p) for p in matches]

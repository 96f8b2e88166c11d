"""The files an input glob names: files as they are, and a folder that `datasets.save_to_disk`
wrote (state.json beside its Arrow files) as its Arrow files, in the order state.json lists."""

from __future__ import annotations

import glob
import json
import os


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

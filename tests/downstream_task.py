"""A downstream task defined by the tests: an lm-evaluation-harness task YAML with its data in a
local JSONL file (no network), multiple choice between continuations of real text."""

from __future__ import annotations

import json
from pathlib import Path

NAME = "tiny_choice"

YAML = """task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""

DOCUMENTS = [
    ("The function returns", [" the value", " zebra purple", " of of of"], 0),
    ("To open a file,", [" use open()", " banana sky", " the the"], 0),
    ("Python is", [" a language", " green spoon", " ,,,"], 0),
    ("import numpy", [" as np", " moon cat", " ))"], 0),
]


def write(folder: Path) -> Path:
    """The task's YAML and data in `folder` (what eval.task_paths names)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "tiny_choice.jsonl"
    lines = [json.dumps({"context": c, "choices": ch, "answer": a}) for c, ch, a in DOCUMENTS]
    data.write_text("\n".join(lines) + "\n")
    (folder / "tiny_choice.yaml").write_text(YAML.format(data=data))
    return folder

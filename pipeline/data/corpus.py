"""The built-in corpus: real English text that ships with Python itself, so a first run needs
no network and no data. One document per standard-library module (its docstrings in source
order) plus one per `help()` topic, written as JSONL with a `text` field."""

from __future__ import annotations

import ast
import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from pipeline.core import files

MIN_DOCUMENT_CHARS = 200


def _module_documents(stdlib: Path) -> Iterator[str]:
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib).parts
        if rel[0] in ("site-packages", "dist-packages") or {"test", "tests", "idle_test"} & set(
            rel
        ):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        nodes = (n for n in ast.walk(tree) if isinstance(n, _DOCUMENTED))
        parts = [d for d in (ast.get_docstring(n) for n in nodes) if d]
        text = "\n\n".join(parts)
        if len(text) >= MIN_DOCUMENT_CHARS:
            yield text


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _help_topics() -> Iterator[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data
        return
    for name in sorted(topics):
        if len(topics[name]) >= MIN_DOCUMENT_CHARS:
            yield topics[name]


def documents() -> Iterator[str]:
    yield from _help_topics()
    yield from _module_documents(Path(sysconfig.get_paths()["stdlib"]))


def build(path: Path, max_bytes: int) -> dict:
    """Write the corpus to `path` (atomically) unless it is there, built for `max_bytes`;
    return its counts."""
    meta_path = path.with_suffix(".json")
    meta = files.read_json_or_none(meta_path)
    if meta is not None and path.exists() and meta.get("max_bytes", max_bytes) == max_bytes:
        return meta
    count = size = 0
    with files.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for text in documents():
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            out.write(line)
            count += 1
            size += len(text.encode())
            if size >= max_bytes:
                break
    meta = {"documents": count, "text_bytes": size, "max_bytes": max_bytes, "path": str(path)}
    files.write_json(meta_path, meta)
    return meta

"""Whether the data of lm-evaluation-harness tasks is in a task cache, and fetching it there.

Run as `python -m pipeline.evaluation.task_data check|fetch CACHE TASKS_JSON PATHS_JSON`, in a
process of its own: the Hugging Face libraries read their cache folders and offline switches
once, when first imported, so each use gets a fresh process with its own environment, and the
launcher that asks is left as it was. Prints one JSON object: {"unknown": [task, ...],
"missing": {task: why}}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def survey(tasks: list[str], task_paths: list[str]) -> dict:
    """Load each task as scoring loads it (its data included), in this process's environment."""
    from pipeline.evaluation.harness import task_manager

    manager = task_manager(task_paths)
    known = set(manager.all_tasks)
    unknown = [t for t in tasks if t not in known]
    missing = {}
    for task in tasks:
        if task in known:
            try:
                manager.load_task_or_group([task])
            except Exception as e:  # no data offline, a failed download, a broken task
                missing[task] = _first_line(e)
    return {"unknown": unknown, "missing": missing}


def main(argv: list[str]) -> None:
    import os

    from pipeline.evaluation.harness import cache_env

    what, cache, tasks, paths = argv
    os.environ.update(cache_env(Path(cache), offline=what == "check"))
    result = survey(json.loads(tasks), json.loads(paths))
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

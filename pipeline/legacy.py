"""Jobs queued by pipeline 0.1, before the package layout of 0.2, keep working for this one
release (to be removed in 0.3).

A queued job is a pickle that submitit loads when the job starts: it names 0.1's modules
(`pipeline.jobs.ArrayTask` or `DistributedTask`, holding a step function such as
`pipeline.tokenize.run_task`, and the config as a DictConfig). `install` registers those
module names, so the pickle loads, and the task runs the same step of this version with the
config turned into the typed one. Only pipeline/__init__.py uses this module: importing the
package registers those names (each a stand-in that only a queued job's pickle can use).
"""

from __future__ import annotations

import sys
import types
from typing import Any

# 0.1's module -> {function name: the step it ran}
RETIRED_STEPS = {
    "pipeline.tokenizer": {"run": "tokenizer"},
    "pipeline.tokenize": {"run_task": "tokenize"},
    "pipeline.verify": {"run": "verify"},
    "pipeline.index_cache": {"run": "index"},
    "pipeline.graph": {"run_train": "train", "run_evaluate": "evaluate"},
}


class RetiredStep:
    """Stands where a pickle of 0.1 names a step function."""

    def __init__(self, step: str) -> None:
        self.step = step


def _current(fn: RetiredStep, composed: Any):
    from pipeline import config
    from pipeline.orchestration import graph

    return graph.step_named(fn.step), config.typed(composed)  # validated when it was queued


class ArrayTask:
    fn: RetiredStep
    cfg: Any

    def __call__(self, index: int) -> Any:
        from pipeline.orchestration import tasks

        return tasks.ArrayTask(*_current(self.fn, self.cfg))(index)


class DistributedTask:
    fn: RetiredStep
    cfg: Any

    def __call__(self) -> Any:
        from pipeline.orchestration import tasks

        return tasks.DistributedTask(*_current(self.fn, self.cfg))()


def install() -> None:
    """Register 0.1's module names, unless something real already has them."""
    jobs = types.ModuleType("pipeline.jobs", "0.1's job callables (see pipeline.legacy)")
    jobs.ArrayTask, jobs.DistributedTask = ArrayTask, DistributedTask
    sys.modules.setdefault("pipeline.jobs", jobs)
    for name, functions in RETIRED_STEPS.items():
        module = types.ModuleType(name, "0.1's step functions (see pipeline.legacy)")
        for function, step in functions.items():
            setattr(module, function, RetiredStep(step))
        sys.modules.setdefault(name, module)

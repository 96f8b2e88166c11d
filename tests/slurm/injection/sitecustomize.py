"""Fault injection for the Slurm tests, imported by every Python process started with this
folder on PYTHONPATH: with PIPELINE_TEST_FAIL_AT=RANK:STEP, training rank RANK raises in the
optimizer phase of step STEP, every time it gets there (a fault that a restart cannot cure)."""

import os

_spec = os.environ.get("PIPELINE_TEST_FAIL_AT")
if _spec:
    from pipeline.resilience import progress

    _rank, _step = (int(part) for part in _spec.split(":"))
    _phase = progress.Reporter.phase

    def _failing_phase(self, name, step=None):
        _phase(self, name, step)
        if name == "optimizer" and self.step + 1 == _step and os.environ.get("RANK") == str(_rank):
            raise RuntimeError(f"injected fault in step {_step}")

    progress.Reporter.phase = _failing_phase

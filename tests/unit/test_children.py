"""A process forked by a pipeline process (megatron-core's checkpoint writers are) dies when
that process is killed, instead of living on with the run folder's lock and the launcher's
output pipe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

PARENT = """
import multiprocessing, sys, time
import pipeline  # what every pipeline process imports first

def child():
    time.sleep(120)

if __name__ == "__main__":
    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    print(p.pid, flush=True)
    time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_forked_child_dies_when_its_parent_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.time() + 10
        while alive(child) and time.time() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the forked child outlived its killed parent"
    finally:
        parent.kill()
        for pid in [child] if "child" in locals() else []:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

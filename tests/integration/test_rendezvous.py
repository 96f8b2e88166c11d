"""A rank that cannot reach the rendezvous, and a first rank that some rank never reaches,
fail within cluster.rendezvous_timeout_s in one line naming the address, instead of waiting
for the collective timeout (30 minutes) while the job holds its nodes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

INIT = """
from pipeline.core.errors import StageError
from pipeline.runtime import distributed
try:
    distributed.init("gloo")
except StageError as e:
    print(f"error: {e}")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("rank,who", [(1, "could not reach"), (0, "some rank did not reach")])
def test_a_rendezvous_nobody_completes_fails_in_bounded_time_naming_the_address(rank, who):
    port = free_port()
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PIPELINE_RENDEZVOUS_TIMEOUT_S": "3",
        "PATH": "/usr/bin:/bin",
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", INIT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    took = time.monotonic() - started
    [line] = done.stdout.splitlines()
    assert line.startswith(
        f"error: rendezvous: rank {rank} of 2: {who} 127.0.0.1:{port} within "
        "cluster.rendezvous_timeout_s=3 s ("
    )
    assert took < 60  # imports, then about 3 s of waiting

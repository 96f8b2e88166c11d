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


def rank_env(rank: int, port: int, timeout_s: int) -> dict[str, str]:
    """One rank of two meeting on 127.0.0.1:`port`."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PIPELINE_RENDEZVOUS_TIMEOUT_S": str(timeout_s),
        "PATH": "/usr/bin:/bin",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("rank,who", [(1, "could not reach"), (0, "some rank did not reach")])
def test_a_rendezvous_nobody_completes_fails_in_bounded_time_naming_the_address(rank, who):
    port = free_port()
    env = rank_env(rank, port, 3)
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


def test_a_first_rank_whose_port_is_taken_says_so_at_once():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = rank_env(0, port, 30)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", INIT], cwd=ROOT, env=env, capture_output=True, text=True
        )
    assert done.stdout == (
        f"error: rendezvous: rank 0 of 2 could not listen on 127.0.0.1:{port}: the port is in "
        "use on the first node; rerun (a requeued job keeps its port: set MASTER_PORT to a "
        "free one)\n"
    )
    assert time.monotonic() - started < 25  # at once, not after the 30 s of waiting


def test_every_rank_of_a_job_derives_one_port_below_the_outgoing_connections_range():
    from pipeline.orchestration.rendezvous import PORTS, port_of

    ports = {port_of(str(job)) for job in range(1, 2000)}
    assert all(PORTS[0] <= p <= PORTS[1] < 32768 for p in ports)
    assert len(ports) > 1750  # spread over the range (uniform draws give about 1850 distinct)
    assert port_of("10") == port_of("10")

"""Where a job's ranks meet: the first node of the allocation, by an address every rank can
reach, on a port every rank derives from the job id. Slurm names nodes, and a node's name need
not be a host name (n1, gpu-a07): then the address is the NodeAddr Slurm has for it."""

from __future__ import annotations

import random
import re
import socket
import subprocess

from pipeline.core.errors import StageError
from pipeline.resilience import scheduler

NODE_ADDR = re.compile(r"\bNodeAddr=(\S+)")
# Below Linux's default range of ports for outgoing connections (32768-60999), from which
# any client socket on the first node may hold a port (submitit's default, 20000-60000,
# overlaps it: a rank 0 then fails to listen, "address already in use")
PORTS = (20000, 32767)


def port_of(job_id: str) -> int:
    """The rendezvous port of a job: the same on every rank, without talking to each other."""
    return random.Random(str(job_id)).randint(*PORTS)


def resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def address_of(node: str) -> str:
    """`node` itself when it resolves (no load on slurmctld), else its NodeAddr from
    `scontrol show node`."""
    if resolves(node):
        return node
    try:
        shown = scheduler.show_node(node)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StageError(
            f"rendezvous: node {node} is not a host name and `scontrol show node {node}` "
            f"could not run ({e}); set MASTER_ADDR to an address of the first node"
        ) from None
    found = NODE_ADDR.search(shown.stdout)
    if shown.returncode != 0 or not found:
        said = (shown.stderr or shown.stdout).strip().splitlines()
        raise StageError(
            f"rendezvous: node {node} is not a host name and Slurm gave no NodeAddr for it "
            f"({said[0] if said else f'scontrol exit {shown.returncode}'}); set MASTER_ADDR "
            "to an address of the first node"
        )
    return found.group(1)

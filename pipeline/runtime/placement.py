"""Where a job's ranks run: each rank's node and its place in the parallel layout, gathered
from every rank, so a run can show (and a test can check) which node ran which rank."""

from __future__ import annotations

import os
import socket


def node_name() -> str:
    """Slurm's name for this node (node names need not be host names), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def gather(mine: dict) -> list[dict]:
    """Every rank's `mine`, in rank order, on every rank."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [mine]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def describe(ranks: list[dict]) -> str:
    """'4 ranks on 2 nodes: n1 (ranks 0-1), n2 (ranks 2-3)'."""
    by_node: dict[str, list[int]] = {}
    for r in ranks:
        by_node.setdefault(r["node"], []).append(r["rank"])
    parts = [
        f"{node} (rank{'s' if len(on) > 1 else ''} {_spans(sorted(on))})"
        for node, on in by_node.items()
    ]
    nodes = len(by_node)
    return f"{len(ranks)} rank{'s' if len(ranks) > 1 else ''} on {nodes} node{'s' if nodes > 1 else ''}: {', '.join(parts)}"


def _spans(numbers: list[int]) -> str:
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)

"""The first node's address: its name when that resolves; otherwise Slurm's NodeAddr for it,
and a one-line error when there is none (the cluster test, tests/slurm, resolves real nodes
named n1..n3, which are not host names)."""

from __future__ import annotations

import pytest

from pipeline.core.errors import StageError
from pipeline.orchestration import rendezvous


def test_a_name_that_resolves_is_used_as_it_is():
    assert rendezvous.address_of("localhost") == "localhost"


def test_a_node_name_nothing_resolves_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol here
    with pytest.raises(StageError) as failed:
        rendezvous.address_of("n-does-not-exist.invalid")
    message = str(failed.value)
    assert message.startswith(
        "rendezvous: node n-does-not-exist.invalid is not a host name and "
        "`scontrol show node n-does-not-exist.invalid` could not run ("
    )
    assert message.endswith("set MASTER_ADDR to an address of the first node")
    assert "\n" not in message

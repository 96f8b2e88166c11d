"""A real Slurm cluster of three nodes (with accounting) for the tests in this folder.

The cluster is started once per session by ``tools/local_slurm.sh up`` in a temp dir
and stopped by ``tools/local_slurm.sh down`` at the end. ``SLURM_CONF`` is set in
``os.environ`` for the whole session, so sbatch/squeue/sacct/submitit started from
the tests talk to it. Install the packages with ``sudo tools/local_slurm.sh install``.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "tools" / "local_slurm.sh"

# What `local_slurm.sh up` runs; the daemons live in sbin, which a user PATH may lack.
REQUIRED_BINARIES = (
    "sbatch",
    "squeue",
    "sacct",
    "sacctmgr",
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "munged",
    "mariadbd",
)
UP_TIMEOUT_S = 300
DOWN_TIMEOUT_S = 180


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    dir: Path
    conf: Path


def _missing_binaries() -> list[str]:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in REQUIRED_BINARIES if shutil.which(name, path=path) is None]


def _run_script(command: str, cluster_dir: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    # stdout carries only the `export SLURM_CONF=...` line; logs come on stderr.
    return subprocess.run(
        [str(SCRIPT), command, str(cluster_dir)],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=timeout,
        check=False,
    )


def _parse_conf(stdout: str) -> Path:
    for line in stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and words[1].startswith("SLURM_CONF="):
            return Path(words[1].split("=", 1)[1])
    raise ValueError(f"no 'export SLURM_CONF=...' line in: {stdout!r}")


def _down(cluster_dir: Path) -> subprocess.CompletedProcess[str]:
    return _run_script("down", cluster_dir, DOWN_TIMEOUT_S)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = _missing_binaries()
    if missing:
        reason = (
            f"Slurm is not installed (missing {', '.join(missing)}); "
            f"run: sudo {SCRIPT.relative_to(REPO_ROOT)} install"
        )
        # In CI a missing cluster is a broken setup, not a reason to skip silently.
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)", pytrace=False)
        pytest.skip(reason)

    cluster_dir = tmp_path_factory.mktemp("slurm")
    try:
        up = _run_script("up", cluster_dir, UP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        _down(cluster_dir)
        pytest.fail(
            f"local_slurm.sh up timed out after {UP_TIMEOUT_S}s:\n{exc.stderr}", pytrace=False
        )
    if up.returncode != 0:
        _down(cluster_dir)  # stop whatever did start
        pytest.fail(f"local_slurm.sh up failed (rc={up.returncode}):\n{up.stderr}", pytrace=False)
    conf = _parse_conf(up.stdout)

    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        yield SlurmCluster(dir=cluster_dir, conf=conf)
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        down = _down(cluster_dir)
        if down.returncode != 0:
            pytest.fail(
                f"local_slurm.sh down failed (rc={down.returncode}):\n{down.stderr}", pytrace=False
            )

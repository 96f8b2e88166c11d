"""Bad and hostile configuration through the real command line: every mistake is refused in
one line naming the key, before anything is written or submitted; values that reach the sbatch
scripts cannot run commands."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli

INVALID = [
    # (override, the key the error must name)
    ("data.num_shards=0", "data.num_shards"),
    ("data.split='90,10'", "data.split"),
    ("data.inputs=[/nonexistent/*.jsonl]", "data.inputs"),
    ("data.inputs=[/tmp]", "data.inputs"),  # a folder, not its files
    ("data.merge_into=0", "data.merge_into"),
    ("tokenizer.vocab_size=10", "tokenizer.vocab_size"),
    ("tokenizer.vocab_size=256", "tokenizer.vocab_size"),  # the 260 fixed pieces
    ("tokenizer.type=wordpiece", "tokenizer.type"),
    ("model.num_query_groups=3", "model.num_query_groups"),
    ("model.position_embedding=alibi", "model.position_embedding"),
    ("model.hidden_dropout=1.0", "model.hidden_dropout"),
    ("model.make_vocab_size_divisible_by=0", "model.make_vocab_size_divisible_by"),
    ("parallel.tensor=3", "parallel.tensor"),
    ("parallel.sequence_parallel=true", "parallel.sequence_parallel"),
    ("train.micro_batch_size=0", "train.micro_batch_size"),
    ("train.global_batch_size=30", "train.global_batch_size"),
    ("train.grad_accum=0", "train.grad_accum"),
    ("train.steps=0", "train.steps"),
    ("train.warmup_steps=5000", "train.warmup_steps"),
    ("train.lr=0", "train.lr"),
    ("train.adam_beta2=1.5", "train.adam_beta2"),
    ("train.clip_grad=-1", "train.clip_grad"),
    ("train.keep_last=0", "train.keep_last"),
    ("train.profile_steps=[5]", "train.profile_steps"),
    ("train.nonfinite=ignore", "train.nonfinite"),
    ("eval.top_p=0", "eval.top_p"),
    ("cluster.nodes=0", "cluster.nodes"),
    ("cluster.cpus_per_task=0", "cluster.cpus_per_task"),
    ("cluster.executor=slurm", "cluster.executor"),
    ("cluster.partition='gpu\nrm -rf ~'", "cluster.partition"),
    ("+cluster.sbatch_extra.comment='x\nrm -rf ~'", "cluster.sbatch_extra.comment"),
    ("+cluster.sbatch_extra.exclusive=false", "cluster.sbatch_extra.exclusive"),
    ("+cluster.env.NCCL_DEBUG='INFO\nrm -rf ~'", "cluster.env.NCCL_DEBUG"),
    ("+cluster.env.NCCL-IB=x", "cluster.env"),
    ("cluster.container_mounts=[/lustre]", "cluster.container_mounts"),
    ("cluster.srun_args=['--x\nrm -rf ~']", "cluster.srun_args"),
    ("force=trian", "force"),
    ("train.eval_iters=4", "train.eval_iters"),
    # what Hydra itself refuses, in one line too
    ("train.stepz=20", "train.stepz"),
    ("+train.stepz=20", "train.stepz"),
    ("trian.steps=20", "trian"),
    ("train.steps=many", "train.steps"),
    ("train.async_save=maybe", "train.async_save"),
    ("model=gpt-13b", "model"),
    ("data.inputs=/data/a.jsonl", "data.inputs"),  # not a list
    ("data.split=1,0,0", "data.split"),  # a sweep, to Hydra
    ("data.max_reject_fraction=1.5", "data.max_reject_fraction"),
    # bounds that would fail hours later
    ("train.steps=100000000", "train.steps"),
    ("train.global_batch_size=1000000000000", "train.steps"),
    ("cluster.nodes=2", "cluster.executor"),
]


@pytest.mark.parametrize("override,key", INVALID, ids=[key for _, key in INVALID])
def test_an_invalid_value_is_refused_in_one_line_naming_the_key(override, key, tmp_path):
    result = cli(f"workdir={tmp_path / 'run'}", override, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {key}: ")
    assert result.stdout == ""
    assert not any(tmp_path.iterdir()), "nothing may be written for an invalid config"


@pytest.mark.parametrize(
    "override,key",
    [
        ("cluster.account='team\ntouch pwned'", "cluster.account"),
        ("+cluster.sbatch_extra.constraint='h100\rtouch pwned'", "cluster.sbatch_extra.constraint"),
        ("workdir='{tmp}/run\ntouch pwned'", "workdir"),
    ],
)
def test_a_newline_in_a_script_value_is_refused_before_any_script_is_made(override, key, tmp_path):
    args = ["dry_run=true", "cluster=slurm", override.format(tmp=tmp_path)]
    if key != "workdir":
        args.append(f"workdir={tmp_path / 'run'}")
    result = cli(*args, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {key}: must not contain a newline")
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert not any(tmp_path.iterdir())


def test_a_site_config_file_with_a_hostile_sbatch_option_name_is_refused(tmp_path):
    site = tmp_path / "site" / "cluster"
    site.mkdir(parents=True)
    (site / "evil.yaml").write_text(
        'defaults:\n  - slurm\n  - _self_\nsbatch_extra:\n  "exclusive\\ntouch pwned": true\n'
    )
    command = [sys.executable, "-m", "pipeline", f"--config-dir={tmp_path / 'site'}"]
    result = subprocess.run(
        [*command, "cluster=evil", "dry_run=true", f"workdir={tmp_path / 'run'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "error: cluster.sbatch_extra: 'exclusive\\ntouch pwned' is not an sbatch option name\n"
    )
    assert not (tmp_path / "run").exists()


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_shell_words_in_config_values_never_run_in_the_sbatch_scripts(tmp_path):
    """The dry run's sbatch scripts, run by bash with srun replaced by a recorder: every
    hostile value stays one word, and nothing it spells out is executed."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "canary").write_text("still here")
    pwned = tmp_path / "pwned"
    hostile = f"x; rm -rf ~ $(touch {pwned}) `touch {pwned}`"
    workdir = f"{tmp_path}/run {hostile}"
    result = cli(
        "dry_run=true",
        "cluster=slurm",
        f"workdir='{workdir}'",
        f"+cluster.sbatch_extra.comment='{hostile}'",
        f"cluster.partition='{hostile}'",
        f"cluster.qos='{hostile}'",
        f"cluster.setup=['echo setup ran >> {tmp_path}/setup.log']",  # shell by design
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    scripts = result.stdout.split("\n# ---- ")[1:]
    assert len(scripts) == 6  # tokenizer, tokenize, verify, index, train, evaluate

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "srun", f'for a in "$@"; do printf "%s\\0" "$a"; done >> {tmp_path}/srun.args')
    _stub(bin_dir, "rm", f"echo rm ran >> {tmp_path}/rm.log")
    # the training job's script runs its supervisor itself, which then runs srun: recorded too
    _stub(bin_dir, "python", f'for a in "$@"; do printf "%s\\0" "$a"; done >> {tmp_path}/srun.args')
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home)}
    for script in scripts:
        name, text = script.split(" ----\n", 1)
        for line in text.splitlines():
            if line.startswith("#SBATCH --comment") or line.startswith("#SBATCH --partition"):
                assert shlex.split(line)[1].endswith(f"={hostile}")  # one word, as sbatch reads
        path = tmp_path / f"{name}.sh"
        path.write_text(text.replace(sys.executable, str(bin_dir / "python")))
        subprocess.run(["bash", str(path)], env=env, check=True, timeout=60)
        args = (tmp_path / "srun.args").read_text().split("\0")[:-1]
        assert args[-1] == f"{workdir}/logs/jobs/{name}/%j", args  # the folder, one argument
        (tmp_path / "srun.args").unlink()
    assert not pwned.exists() and not (tmp_path / "rm.log").exists()
    assert (home / "canary").read_text() == "still here"
    assert (tmp_path / "setup.log").read_text() == "setup ran\n" * 6
    assert not os.path.exists(workdir), "a dry run writes nothing"

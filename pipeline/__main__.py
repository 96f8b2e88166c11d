"""`python -m pipeline [overrides]`: compose the config, check it, run or submit the stages."""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from pipeline import config as config_schema
from pipeline import files
from pipeline.config import ConfigError
from pipeline.errors import StageError
from pipeline.lock import RunLocked

config_schema.register()


def check_stage_inputs(cfg: DictConfig) -> None:
    """A stage run alone needs the outputs of the stages before it."""
    from pipeline import data
    from pipeline.layout import RunLayout

    layout = RunLayout.of(cfg.workdir)
    if "tokenize" not in cfg.stages and not layout.manifest.exists():
        raise ConfigError(f"stages: no tokenized data in {layout.data_dir}; add tokenize to stages")
    if "tokenize" not in cfg.stages:
        data.check_splits(data.load_manifest(cfg), cfg)
    evaluate_alone = "evaluate" in cfg.stages and "train" not in cfg.stages
    named = str(cfg.eval.checkpoint) in ("best", "latest")
    if evaluate_alone and named and not layout.checkpoints.exists():
        raise ConfigError(f"stages: no checkpoints in {layout.checkpoints}; add train to stages")


def launch_steps(cfg: DictConfig) -> None:
    """Print the plan, then run or submit every step that is not complete yet."""
    from pipeline import graph, launch

    if "train" in cfg.stages:  # the plan, before anything is submitted
        from pipeline import plan

        for line in plan.summary_lines(cfg, plan.vocab_size_of(cfg)[0]):
            print(line, file=sys.stderr)
    steps = graph.build(cfg, prepare=not cfg.dry_run)  # a dry run writes nothing
    todo = graph.pending(steps, cfg)
    done = [s.name for s in steps if s not in todo]
    if done:
        print(f"[pipeline] already complete: {', '.join(done)}", file=sys.stderr)
    launch.run(todo, cfg)


def execute(cfg: DictConfig) -> int:
    from pipeline import files, sweep
    from pipeline.layout import RunLayout

    if sweep.is_multirun():
        cfg = sweep.point_config(cfg)

    logging.getLogger("megatron").setLevel(logging.WARNING)  # its per-file INFO lines drown ours
    config_schema.validate(cfg)
    if cfg.data.prepared:
        sweep.link_prepared_data(cfg)
    check_stage_inputs(cfg)
    if "train" in cfg.stages:  # refuse what would fail after hours in the queue
        from pipeline import plan

        plan.preflight(cfg, plan.vocab_size_of(cfg)[0])
    layout = RunLayout.of(cfg.workdir)
    if cfg.dry_run:
        launch_steps(cfg)
        return 0
    from pipeline.lock import run_lock

    with run_lock(layout.root):  # one launcher per run folder
        files.write_text(layout.config, OmegaConf.to_yaml(cfg, resolve=True))
        launch_steps(cfg)
    print(f"\nRun folder: {layout.root}")
    if layout.summary.exists():
        print(f"Summary:    {layout.summary}")
        print(layout.summary.read_text())
    return 0


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> int:
    try:
        return execute(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except RunLocked as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(3)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception as e:
        cause = files.space_error(e)  # out of space somewhere no stage named the file
        if cause is None:
            raise
        what = cause.filename or "the run folder"
        print(f"error: {files.out_of_space_message(cause, what)}", file=sys.stderr)
        sys.exit(1)


def slurm_answers() -> bool:
    """sbatch is installed and a Slurm controller answers (installed alone is not enough)."""
    import shutil
    import subprocess

    if not shutil.which("sbatch"):
        return False
    try:
        probe = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def choose_cluster(argv: list[str]) -> None:
    """With no cluster named where a Slurm controller answers (a login node), submit to Slurm."""
    if not any(arg.startswith(("cluster=", "+cluster=")) for arg in argv) and slurm_answers():
        argv.append("cluster=slurm")
        print(
            "[pipeline] Slurm answers here: cluster=slurm (pass cluster=local to run here)",
            file=sys.stderr,
        )


if __name__ == "__main__":
    choose_cluster(sys.argv)
    main()

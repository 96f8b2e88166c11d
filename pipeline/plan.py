"""`python -m pipeline.plan [overrides] [--search] [--gpu-memory GB] [--gpus N] [--gpu NAME]
[--tokens N] [--mfu F] [--json]`: plan a run before it is submitted, by arithmetic alone (no
torch): parameters, FLOPs, memory per GPU, the layout's expected speed and wall time, and with
--search the parallel layouts that fit; --json prints the layout and its estimate as one JSON
object. `python -m pipeline.plan --validate`: the throughput model against published runs.

The plan's own flags are taken off the command line before Hydra sees it (`plan.KEY=VALUE`
works too), so the config schema is untouched.
"""

from __future__ import annotations

import functools
import json
import sys

import hydra
from omegaconf import DictConfig

from pipeline import cli, usage
from pipeline.config import PipelineConfig
from pipeline.core import log
from pipeline.core.errors import ConfigError
from pipeline.planning import preflight, run_gpu
from pipeline.planning.render import PlanOptions, plan_json, plan_lines

_FLAGS = {
    "--search": "search",
    "--gpu-memory": "gpu_memory_gb",
    "--gpus": "gpus",
    "--gpu": "gpu",
    "--tokens": "tokens",
    "--mfu": "mfu",
    "--json": "json",
}
# Flags that name the run's GPU: they set its cluster keys (unless the overrides do), so that
# every line of the plan is for the GPU the launcher would use
_CLUSTER_KEYS = {"gpu": "cluster.gpu", "gpu_memory_gb": "cluster.gpu_memory_gb"}
_SWITCHES = {"search", "json"}
_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_tokens(text: str) -> float:
    """1e9, 300M, 2B, 1.5T."""
    text = text.strip().upper()
    if text and text[-1] in _SUFFIX:
        return float(text[:-1]) * _SUFFIX[text[-1]]
    return float(text)


def _set_option(options: PlanOptions, name: str, value: str) -> None:
    if name in _SWITCHES:
        setattr(options, name, value.lower() not in ("false", "0", "no"))
    elif name == "gpus":
        options.gpus = int(value)
    elif name == "tokens":
        options.tokens = parse_tokens(value)
    else:
        setattr(options, name, float(value))


def pop_options(argv: list[str]) -> tuple[PlanOptions, list[str]]:
    """Take the plan's own flags (--gpu-memory 80, --gpu-memory=80, plan.gpu_memory_gb=80, ...)
    out of argv; the rest are Hydra overrides, with cluster.gpu and cluster.gpu_memory_gb for
    --gpu and --gpu-memory where the overrides do not set them."""
    options, rest, cluster = PlanOptions(), [], {}
    names = set(_FLAGS.values())
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, _, inline = arg.partition("=")
        if flag in _FLAGS:
            name = _FLAGS[flag]
            if name in _SWITCHES and not inline:
                value = "true"
            elif inline:
                value = inline
            else:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{flag}: needs a value")
                i += 1
                value = argv[i]
        elif flag.startswith("plan.") and flag[5:] in names and inline:
            name, value = flag[5:], inline
        else:
            rest.append(arg)
            i += 1
            continue
        if name in _CLUSTER_KEYS:
            cluster[_CLUSTER_KEYS[name]] = value
        else:
            _set_option(options, name, value)
        i += 1
    for key, value in cluster.items():
        if not any(arg.startswith(f"{key}=") for arg in rest):
            rest.append(f"{key}={value}")
    return options, rest


def show(options: PlanOptions, cfg: PipelineConfig) -> None:
    preflight.check_fp8(cfg, run_gpu.of(cfg))  # what the launcher refuses, the plan does too
    if options.json:
        print(json.dumps(plan_json(cfg, options), indent=1))
    else:
        print("\n".join(plan_lines(cfg, options)))


def main() -> None:
    log.take_quiet(sys.argv)  # -q: warnings and errors only
    usage.answer_help("pipeline.plan", sys.argv[1:])
    if "--validate" in sys.argv[1:]:
        from pipeline.planning.calibration_report import report_lines

        lines, ok = report_lines()
        print("\n".join(lines))
        sys.exit(0 if ok else 1)
    try:
        options, rest = pop_options(sys.argv[1:])
    except ConfigError as e:
        cli.fail(str(e), cli.EXIT_CONFIG)
    sys.argv[1:] = rest = cli.renamed(rest)
    cli.check_overrides(rest)

    @hydra.main(config_path=cli.CONF, config_name="config", version_base=None)
    def plan(composed: DictConfig) -> None:
        cli.run(composed, functools.partial(show, options))

    plan()


if __name__ == "__main__":
    main()

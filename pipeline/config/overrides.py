"""Command-line overrides as Hydra is to read them: which arguments are overrides (not Hydra's
own options or their values), one line for an override Hydra's lexer cannot read, with the
shell-safe form that it can, and an entry of a free-form mapping (cluster.env.NCCL_DEBUG=INFO)
set whether or not the mapping has it yet."""

from __future__ import annotations

import shlex
import typing

from pipeline.config import keys
from pipeline.config.schema import PipelineConfig
from pipeline.core.errors import ConfigError

# Hydra's options that take the next argument as their value (--info takes one optionally)
VALUED = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c"}
VALUED |= {"--package", "-p", "--experimental-rerun", "--info", "-i"}
MULTIRUN = ("-m", "--multirun")


def positions(args: list[str]) -> list[int]:
    """The indexes of the overrides among `args`."""
    found, option = [], ""
    for i, arg in enumerate(args):
        takes_value = option in VALUED and (option not in ("--info", "-i") or "=" not in arg)
        option = arg if arg.startswith("-") else ""
        if not option and not takes_value:
            found.append(i)
    return found


def key_of(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def shell_safe(key: str, value: str) -> str:
    """KEY=VALUE quoted for Hydra (a quoted string holds any character), then for the shell."""
    inner = f'"{value}"' if '"' not in value else "'" + value.replace("'", "\\'") + "'"
    return shlex.quote(f"{key}={inner}")


def readable(arg: str) -> None:
    """Raises ConfigError naming the key when Hydra's lexer cannot read `arg`, and naming the
    word when it is no override at all (what a shell leaves of an unquoted `data.where=score
    >= 3`: `data.where=score` and `3`, the rest taken as a redirection)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if "=" not in arg and not arg.startswith("~"):
        raise ConfigError(
            f"{arg}: not an override (KEY=VALUE); if it is part of a value the shell split (at a "
            "space) or cut (at > or <), quote the whole override for the shell and the value "
            f"for Hydra, e.g. {shell_safe('data.where', 'score >= 3')}"
        )
    try:
        OverridesParser.create().parse_overrides([arg])
    except OverrideParseException:
        key, _, value = arg.partition("=")
        raise ConfigError(
            f"{key_of(arg)}: Hydra cannot read {value!r} as written (it holds characters of "
            f"Hydra's override syntax); quote it for the shell and for Hydra: "
            f"{shell_safe(key, value)}"
        ) from None


def _in_a_mapping(key: str) -> bool:
    """An entry of a dict-typed key (cluster.env.NCCL_DEBUG of cluster.env)."""
    found = keys.leaf(PipelineConfig, key)
    return found is not None and found.name != key and typing.get_origin(found.type) is dict


def for_hydra(arg: str) -> str:
    """`arg` as Hydra is to compose it: readable, and an entry of a mapping as `++KEY=V`
    (set, added when the mapping has no such entry yet), as `--help` promises of every key."""
    readable(arg)
    if arg.startswith(("+", "~")) or "=" not in arg or not _in_a_mapping(key_of(arg)):
        return arg
    return f"++{arg}"

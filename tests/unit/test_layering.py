"""The package's architecture, held against its imports (every import statement, those inside
functions and under TYPE_CHECKING included): each sub-package imports only the layers below it,
no modules import each other in a circle, and the command lines start without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "pipeline"
BELOW = {
    "core": set(),
    "config": {"core"},
    "runtime": {"core"},
    "reporting": {"core"},
    "tracking": {"core", "config"},
    "resilience": {"core", "config", "runtime"},
    "data": {"core", "config", "runtime"},
    "model": {"core", "config", "runtime"},
    "training": {
        "core",
        "config",
        "runtime",
        "resilience",
        "data",
        "model",
        "reporting",
        "tracking",
    },
    "evaluation": {
        "core",
        "config",
        "runtime",
        "data",
        "model",
        "training",
        "reporting",
        "tracking",
    },
    "planning": {
        "core",
        "config",
        "runtime",
        "resilience",
        "data",
        "model",
        "training",
        "reporting",
    },
    "exporting": {"core", "config", "runtime", "data", "model", "training"},
}
BELOW["orchestration"] = set(BELOW) | {"planning"}
# the package's face and the command lines
ENTRY_POINTS = {
    "pipeline",
    "__main__",
    "cli",
    "step",
    "status",
    "plan",
    "export",
    "score",
    "usage",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(path: Path) -> set[str]:
    """The pipeline modules `path` imports: a name imported from a package is its submodule
    when there is one, else the package itself."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "pipeline"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pipeline":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return found


IMPORTS = {name: imported(path) for name, path in MODULES.items()}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in BELOW else "entry point"


def test_every_module_lives_in_a_sub_package_or_is_an_entry_point():
    entry = [m for m in MODULES if layer(m) == "entry point"]
    assert [m for m in entry if m.split(".")[-1] not in ENTRY_POINTS] == []
    assert sorted(BELOW) == sorted(
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    )


def test_imports_flow_one_way_from_the_entry_points_down_to_core():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in IMPORTS.items()
        for target in targets
        if layer(module) != "entry point"
        and layer(target) != layer(module)
        and layer(target) not in BELOW[layer(module)]
    )
    assert wrong == []


def circles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in IMPORTS.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(IMPORTS):
        if module not in index:
            visit(module)
    return found


def test_no_modules_import_each_other_in_a_circle():
    assert circles() == []


def test_the_circle_check_finds_a_circle():
    IMPORTS["pipeline.core.files"].add("pipeline.core.paths")
    IMPORTS["pipeline.core.paths"].add("pipeline.core.files")
    try:
        assert ["pipeline.core.files", "pipeline.core.paths"] in circles()
    finally:
        IMPORTS["pipeline.core.files"] = imported(MODULES["pipeline.core.files"])
        IMPORTS["pipeline.core.paths"] = imported(MODULES["pipeline.core.paths"])


def test_the_command_lines_and_the_data_steps_start_without_torch_or_megatron():
    code = (
        "import sys\n"
        "import pipeline.__main__, pipeline.step, pipeline.status, pipeline.plan\n"
        "import pipeline.data.steps, pipeline.planning.preflight, pipeline.orchestration.launch\n"
        "loaded = [m for m in ('torch', 'megatron', 'sentencepiece') if m in sys.modules]\n"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_unit_tests_and_what_they_import_need_no_torch():
    code = (
        "import sys, pytest\n"
        "assert pytest.main(['tests/unit', '--collect-only', '-q', '-p', 'no:cacheprovider']) == 0\n"
        "loaded = [m for m in ('torch', 'megatron') if m in sys.modules]\n"
        "assert not loaded, loaded"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

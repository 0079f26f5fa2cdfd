"""The house's layering: no import cycles in the package, and no import that runs up the layers (the env layer knows no
sampler, the monitor no run, the engine no algorithm, nothing below the tools a tool). Read from the source, imports in
functions included (a ``TYPE_CHECKING`` block is only for type hints and is left out). And each small rule has one home:
no second copy of write-then-rename, a file lock, ignoring the stop signals or a pid check comes back."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import fleetrl

from conftest import fleetrl_env

PACKAGE = Path(fleetrl.__file__).parent
TOP = ("fleetrl.cli", "fleetrl.evaluate", "fleetrl.tools")  # the commands: they may import anything
# the bottom: small helpers that env workers, children and the tools import; they import only each other, and no torch
BOTTOM = ("fleetrl.errors", "fleetrl.cores", "fleetrl.files", "fleetrl.processes", "fleetrl.parent_watch", "fleetrl.forkserver_init")
# each layer, and what it must never import (everything above it)
FORBIDDEN = {
    "fleetrl.envs": ("fleetrl.sampling", "fleetrl.monitor", "fleetrl.run", "fleetrl.algos", "fleetrl.offpolicy", "fleetrl.learner",
                     "fleetrl.args", *TOP),
    "fleetrl.monitor": ("fleetrl.sampling", "fleetrl.run", "fleetrl.algos", "fleetrl.offpolicy", "fleetrl.learner", *TOP),
    "fleetrl.sampling": ("fleetrl.run", "fleetrl.algos", "fleetrl.offpolicy", "fleetrl.learner", *TOP),
    "fleetrl.run": ("fleetrl.algos", *TOP),
    "fleetrl.run_setup": ("fleetrl.run", "fleetrl.algos", *TOP),
    "fleetrl.algos": TOP,
    **{m: ("fleetrl.run", "fleetrl.algos", *TOP) for m in ("fleetrl.errors", "fleetrl.config", "fleetrl.cores", "fleetrl.nets",
                                                         "fleetrl.accel", "fleetrl.distributed", "fleetrl.checkpoint",
                                                         "fleetrl.runtime", "fleetrl.policy")},
}

# each rule's one home (a path under fleetrl/), and what a second copy of it looks like
HOMES = {
    "files.py": {"write-then-rename": r"\bos\.(replace|rename)\(", "file lock": r"\bfcntl\.(flock|lockf)\b"},
    "processes.py": {"ignoring the stop signals": r"\bSIG_IGN\b",
                     "is this pid alive": r"\bos\.kill\([^,()]+,\s*0\)|\bpid_exists\b|\bSTATUS_ZOMBIE\b"},
}
NOT_YET_MOVED: set[tuple[str, str]] = set()  # (module, rule) pairs allowed a copy while they move to its home


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        name = ".".join((package.name, *path.relative_to(package).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    mods = modules(package)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        # where `from .x import y` starts: a package's own folder for its __init__, else the module's package
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: `from ..run import Run` in fleetrl.envs.x is fleetrl.run's Run
                    up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                target = resolve(name)
                if target and target != module and not module.startswith(target + "."):  # a package's own __init__
                    graph[module].add(target)
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module of a layer above the importer's (FORBIDDEN), as "A imports B"."""
    wrong = []
    for module, targets in graph.items():
        for layer, above in FORBIDDEN.items():
            if module == layer or module.startswith(layer + "."):
                wrong += [f"{module} imports {t}" for t in sorted(targets) if any(t == a or t.startswith(a + ".") for a in above)]
    return wrong


def _imports(tree: ast.AST):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports(node)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_import_runs_up_the_layers():
    assert upward_imports(import_graph()) == []


def test_the_checks_see_a_cycle_and_an_upward_import_however_it_is_written(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "fleetrl.envs.vector" in import_graph()["fleetrl.sampling.sampler"], "the graph holds real imports"
    # a made-up package named fleetrl: the env layer imports upward in each way Python allows, and once for type hints only
    fake = tmp_path / "fleetrl"
    for name, text in {
        "__init__.py": "",
        "run.py": "",
        "algos/__init__.py": "from . import ppo\n",
        "algos/ppo.py": "",
        "sampling/__init__.py": "",
        "sampling/sampler.py": "",
        "envs/__init__.py": "from .vector import make\n",
        "envs/vector.py": "import fleetrl.algos.ppo\n",
        "envs/late.py": "def f():\n    from fleetrl.run import Run\n",
        "envs/relative.py": "from ..sampling import sampler\n",
        "envs/hinted.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fleetrl.run import Run\n",
    }.items():
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(text)
    graph = import_graph(fake)
    assert graph["fleetrl.envs"] == {"fleetrl.envs.vector"} and graph["fleetrl.algos"] == {"fleetrl.algos.ppo"}, "relative, in a package"
    assert sorted(upward_imports(graph)) == ["fleetrl.envs.late imports fleetrl.run", "fleetrl.envs.relative imports fleetrl.sampling.sampler",
                                             "fleetrl.envs.vector imports fleetrl.algos.ppo"], "a TYPE_CHECKING import is left out"


def test_the_bottom_imports_nothing_above_it_and_no_torch():
    graph = import_graph()
    assert {m: sorted(graph[m] - set(BOTTOM)) for m in BOTTOM if graph[m] - set(BOTTOM)} == {}
    code = f"import sys, {', '.join(BOTTOM)}; print(sorted(m for m in ('torch', 'numpy', 'gymnasium') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=fleetrl_env())
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr[-2000:])


def test_each_small_rule_is_written_once_in_its_home():
    copies = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        for home, rules in HOMES.items():
            for rule, pattern in rules.items():
                if name != home and (name, rule) not in NOT_YET_MOVED and re.search(pattern, text):
                    copies.append(f"{name}: {rule} (its home is fleetrl/{home})")
    assert copies == []

"""docs/engine.md is the engine's public API for an algorithm file: every engine name the built-in algorithms (the
templates `fleetrl new` copies) use is documented there, and every name documented there exists.

The doc's convention, which this test reads: a public name is the first cell of a table row, in backticks, fully
qualified (`fleetrl.run.Run.start`), and the keyword arguments a template passes to it appear in that row (unless its
signature is `(**objects)`: any names). What a
template uses: each `from fleetrl... import NAME` and `import fleetrl...` anywhere in the file; for an imported module
(`from fleetrl import config`), each attribute the file reads off it (`config.positive`); for the run
(`with Run.start(...) as run`), each attribute of the run (`run.make_envs`). An imported module itself need only be
named somewhere in the doc. Parsed with `ast`; nothing is run but imports.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

from fleetrl.algos import ALGOS

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "engine.md"
TEMPLATES = ALGOS
RUN_START, RUN = "fleetrl.run.Run.start", "fleetrl.run.Run"  # `with Run.start(...) as run`: run's attributes are Run's
QUALIFIED = re.compile(r"`(fleetrl(?:\.\w+)+)`")
ROW = re.compile(r"^\|\s*`(fleetrl(?:\.\w+)+)`\s*\|")
ANY_KEYWORDS = re.compile(r"`\(\*\*\w+\)`")  # a row whose signature is `(**objects)` takes any keyword names


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def read_doc(text: str) -> tuple[dict[str, str], set[str]]:
    """The doc's public names (first cells of table rows), each with its row, and every qualified name it mentions."""
    rows = {}
    for line in text.splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(1)] = line
    return rows, set(QUALIFIED.findall(text))


def uses(source: str) -> list[tuple[str, int, tuple[str, ...]]]:
    """What a file uses of fleetrl: (qualified name, line, keyword arguments passed to it at that line). Modules come
    with no keywords and are marked by being modules."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the qualified name it stands for
    found: list[tuple[str, int, tuple[str, ...]]] = []
    for node in ast.walk(tree):  # imports anywhere in the file, not only at the top
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "fleetrl":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                bound[alias.asname or alias.name] = full
                found.append((full, node.lineno, ()))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "fleetrl":
                    bound[alias.asname or "fleetrl"] = alias.name if alias.asname else "fleetrl"
                    found.append((alias.name, node.lineno, ()))

    def qualify(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return bound.get(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = qualify(expr.value)
            return f"{owner}.{expr.attr}" if owner is not None else None
        return None

    for node in ast.walk(tree):  # the run: `with Run.start(...) as run` binds run to a Run
        if isinstance(node, ast.With):
            for item in node.items:
                call, var = item.context_expr, item.optional_vars
                if isinstance(call, ast.Call) and qualify(call.func) == RUN_START and isinstance(var, ast.Name):
                    bound[var.id] = RUN
    runs = {name for name, full in bound.items() if full == RUN}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = qualify(node.value)
            if owner is not None and (is_module(owner) or (isinstance(node.value, ast.Name) and node.value.id in runs)):
                found.append((f"{owner}.{node.attr}", node.lineno, ()))
        elif isinstance(node, ast.Call):
            full = qualify(node.func)
            keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
            if full is not None and keywords:
                found.append((full, node.lineno, keywords))
    return found


def undocumented(source: str, filename: str, doc_text: str) -> list[str]:
    """Each use of fleetrl in ``source`` that the doc does not document, as a line of the failure message."""
    rows, mentioned = read_doc(doc_text)
    problems = []
    for full, line, keywords in uses(source):
        where = f"{filename}:{line}"
        if is_module(full):
            if full not in mentioned:
                problems.append(f"{where}: the module `{full}` is not named in docs/engine.md")
        elif full not in rows:
            problems.append(f"{where}: `{full}` has no row in docs/engine.md")
        elif not ANY_KEYWORDS.search(rows[full]):
            problems += [f"{where}: `{full}` is called with {k}=, which its row in docs/engine.md does not name"
                         for k in keywords if not re.search(rf"\b{k}\b", rows[full])]
    return sorted(set(problems))


def resolves(name: str) -> bool:
    """Whether a qualified name exists: the longest importable module, then attributes (a dataclass field counts)."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        if is_module(".".join(parts[:split])):
            obj = importlib.import_module(".".join(parts[:split]))
            break
    else:
        return False
    for attr in parts[split:]:
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
            obj = None  # an instance's field: exists, has no class attribute to look further into
        else:
            return False
    return True


def test_every_engine_name_the_templates_use_is_documented():
    doc = DOC.read_text()
    problems = []
    for algo in TEMPLATES:
        path = ROOT / "fleetrl" / "algos" / f"{algo}.py"
        problems += undocumented(path.read_text(), f"fleetrl/algos/{algo}.py", doc)
    assert not problems, "docs/engine.md misses what the templates use:\n" + "\n".join(problems)


def test_every_name_the_doc_lists_exists():
    rows, mentioned = read_doc(DOC.read_text())
    assert len(rows) > 50, "docs/engine.md lists its public names as table rows that start with `fleetrl.module.name`"
    missing = sorted(name for name in rows.keys() | mentioned if not resolves(name))
    assert not missing, f"docs/engine.md names what fleetrl does not have: {missing}"


def test_the_check_reports_an_undocumented_name():
    doc = "| `fleetrl.run.Run.start` | `(args, explicit, family_defaults, validate, algo)` | the run |\n`fleetrl.config`\n"
    source = (
        "from fleetrl.run import Run\n"
        "from fleetrl import config\n"
        "def train(args):\n"
        "    from fleetrl.sampling.replay import stacks_frames  # an import inside a function counts too\n"
        "    config.path_safe(args.env_id)\n"
        "    with Run.start(args, set(), {}, None, algo='x', wide_network=True) as run:\n"
        "        run.make_envs()\n"
    )
    problems = "\n".join(undocumented(source, "my_algo.py", doc))
    assert "my_algo.py:1: `fleetrl.run.Run` has no row" in problems
    assert "my_algo.py:4: `fleetrl.sampling.replay.stacks_frames` has no row" in problems
    assert "my_algo.py:5: `fleetrl.config.path_safe` has no row" in problems
    assert "my_algo.py:6: `fleetrl.run.Run.start` is called with wide_network=" in problems
    assert "algo=" not in problems  # named in its row
    assert "my_algo.py:7: `fleetrl.run.Run.make_envs` has no row" in problems
    assert "module `fleetrl.config`" not in problems  # named in the doc
    assert not resolves("fleetrl.run.Run.no_such_method") and resolves("fleetrl.run.Run.args")

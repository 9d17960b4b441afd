"""normfl's layers (pyproject.toml's ``[tool.importlinter]``, docs/architecture.md): the contracts hold on the tree as
it is, and a forbidden import, a function-local one too, breaks them; no two packages of normfl import each other,
by a chain or directly; and Hydra's private API is imported by one module, ``normfl.config.hydra_private``."""

from __future__ import annotations

import ast
import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tests.helpers import REPO

CONTRACTS = ("layers", "entry-points", "acyclic")


def lint(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the ``normfl`` package found first under ``root``, with the contracts of the checkout's
    pyproject.toml copied there (no cache: a copy's graph is built from its own files)."""
    if root != REPO:
        shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "200"}                                       # a contract's name on one line of the report
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=60)


def verdicts(out: str) -> dict[str, str]:
    """Each contract's verdict in ``lint-imports``' report, by the contract's id."""
    names = {c["id"]: c["name"] for c in read_contracts()}
    flat = " ".join(out.split())
    return {cid: "KEPT" if f"{name} KEPT" in flat else "BROKEN" if f"{name} BROKEN" in flat else "?"
            for cid, name in names.items()}


def read_contracts() -> list[dict]:
    from importlinter.api import read_configuration

    return read_configuration(str(REPO / "pyproject.toml"))["contracts_options"]


def test_the_contracts_are_kept():
    assert sorted(c["id"] for c in read_contracts()) == sorted(CONTRACTS)
    done = lint(REPO)
    assert done.returncode == 0 and set(verdicts(done.stdout).values()) == {"KEPT"}, done.stdout + done.stderr


@pytest.mark.parametrize("module, line, importer, broken", [
    # the runner importing the reproduction, from inside a function, as run.cli once did
    ("run/training.py", "def _jobs():\n    import normfl.reproduce.jobs\n", "normfl.run.training",
     {"layers", "entry-points", "acyclic"}),
    # collect reading the reproduction's records: the two sit side by side and import nothing of each other
    ("collect.py", "from normfl.reproduce import records  # noqa: E402\n", "normfl.collect",
     {"layers", "entry-points"}),
], ids=["run-imports-reproduce", "collect-imports-reproduce"])
def test_a_forbidden_import_breaks_the_contracts(tmp_path, module, line, importer, broken):
    shutil.copytree(REPO / "normfl", tmp_path / "normfl", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "normfl" / module, "a") as fh:
        fh.write("\n\n" + line)
    done = lint(tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert {c for c, v in verdicts(done.stdout).items() if v == "BROKEN"} == broken, out
    assert importer in out and "normfl.reproduce" in out, out        # the copy's import, so the copy was read


def test_no_two_packages_of_normfl_import_each_other():
    """For every two packages (or modules) directly under normfl/, at most one imports the other, directly or by a
    chain through others, function-local imports included."""
    graph = grimp.build_graph("normfl", cache_dir=None)
    children = sorted(graph.find_children("normfl"))
    both = [(a, b) for a, b in itertools.combinations(children, 2)
            if graph.chain_exists(a, b, as_packages=True) and graph.chain_exists(b, a, as_packages=True)]
    assert not both, "\n".join(f"{a} <-> {b}: {' -> '.join(graph.find_shortest_chain(a, b, as_packages=True))}; "
                               f"{' -> '.join(graph.find_shortest_chain(b, a, as_packages=True))}" for a, b in both)


def test_hydras_private_api_is_imported_by_one_module():
    def private(path: Path) -> bool:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "hydra._internal" or n.startswith("hydra._internal.") for n in names):
                return True
        return False
    users = {str(p.relative_to(REPO)) for p in (REPO / "normfl").rglob("*.py") if private(p)}
    assert users == {"normfl/config/hydra_private.py"}


def test_no_module_of_the_runner_the_driver_or_the_scripts_is_over_450_lines():
    """One concern per file (issue 55.3): a module that grows past 450 lines is split by concern."""
    modules = [*(REPO / "normfl").rglob("*.py"), *(REPO / "scripts").rglob("*.py"), REPO / "train.py"]
    long = {str(p.relative_to(REPO)): n for p in modules if (n := len(p.read_text().splitlines())) > 450}
    assert len(modules) > 100 and not long, long

"""The test suite's own layout (issue 55.5): no test module imports another or the conftest (what modules share
lives in tests/helpers, imported as ``from tests.helpers import X``), and none grows past 450 lines (split it by
concern instead)."""

from __future__ import annotations

import ast

from tests.helpers import REPO

TESTS = sorted((REPO / "tests").rglob("test_*.py"))
MAX_LINES = 450


def imported(path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, at module level or inside a function."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def test_no_test_module_imports_another():
    bad = [f"{path.relative_to(REPO)}:{line}: imports {module}" for path in TESTS for line, module in imported(path)
           if module.split(".")[-1].startswith("test_") or module.split(".")[-1] == "conftest"]
    assert TESTS and not bad, "move what they share to tests/helpers:\n" + "\n".join(bad)


def test_no_test_module_is_over_450_lines():
    long = {str(p.relative_to(REPO)): n for p in TESTS if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long

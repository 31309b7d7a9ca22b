"""The suite's own layout: test modules share helpers through tests/helpers.py and fixtures through conftest.py."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, as written (``from tests import x`` counts as ``tests.x``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_test_module_imports_another_or_the_conftest():
    modules = sorted(TESTS.glob("test_*.py"))
    assert len(modules) > 30  # the check looked at the suite
    offending = {
        path.name: names
        for path in modules
        if (names := [name for name in imported_modules(path)
                      if name.startswith(("tests.test_", "tests.conftest")) or name.startswith("test_")])
    }
    assert offending == {}


def test_the_check_sees_such_an_import(tmp_path):
    module = tmp_path / "test_example.py"
    module.write_text("from tests.test_api_jobs import put\nfrom tests import test_api_clusters\n"
                      "import tests.helpers\n")
    assert imported_modules(module) == ["tests.test_api_jobs", "tests.test_api_jobs.put", "tests",
                                        "tests.test_api_clusters", "tests.helpers"]

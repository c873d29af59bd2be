"""Counts the house's size limits: long functions, long files and argparse flags.

docs/contributing.md states the limits (a function of one job fits 80 lines; a file
of one job fits 500, never 800); this script says where the product code stands
against them, so a change can report its before and after.

    python scripts/house_counts.py            # the totals
    python scripts/house_counts.py --list     # every function and file over a limit
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("looplab", "sweeps", "trainables", "analysis")
LONG_FUNCTION = 80
LONG_FILE = 500
TOO_LONG_FILE = 800


def product_files() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))


def long_functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines) of each function in `path` longer than LONG_FUNCTION."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > LONG_FUNCTION:
                found.append((f"{path.relative_to(ROOT)}:{node.name}", lines))
    return found


def add_argument_calls() -> int:
    """`add_argument` calls in every tracked Python file outside the tests."""
    count = 0
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if parts[0] in {"tests", "runs", "looplab-runs", "site"} or parts[0].startswith("."):
            continue
        count += path.read_text().count(".add_argument(")
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="name every item over a limit")
    args = parser.parse_args(argv)
    files = product_files()
    functions = sorted((f for p in files for f in long_functions(p)), key=lambda f: -f[1])
    sizes = sorted(((str(p.relative_to(ROOT)), len(p.read_text().splitlines())) for p in files), key=lambda s: -s[1])
    over_500 = [s for s in sizes if s[1] > LONG_FILE]
    over_800 = [s for s in sizes if s[1] > TOO_LONG_FILE]
    print(f"functions over {LONG_FUNCTION} lines: {len(functions)}")
    print(f"files over {LONG_FILE} lines: {len(over_500)}")
    print(f"files over {TOO_LONG_FILE} lines: {len(over_800)}")
    print(f"add_argument calls outside the tests: {add_argument_calls()}")
    if args.list:
        for name, lines in functions:
            print(f"  function {name}: {lines}")
        for name, lines in over_500:
            print(f"  file {name}: {lines}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

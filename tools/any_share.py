"""The share of annotations that are a bare ``Any``, and of signature annotations that contain ``Any``.

An annotation is a parameter's, a return's or a variable's (``x: T`` / ``x: T = v``). It is a bare
``Any`` when it is exactly ``Any`` or ``typing.Any`` (also as a string); ``dict[str, Any]`` and
``Any | None`` are not. Unannotated parameters (``self``, ``cls``, or a gap) count for nothing.

The second figure looks at signatures only (parameters and returns) and counts every annotation
that names ``Any`` anywhere (``dict[str, Any]``, ``Callable[..., Any]``): how much of the code's
interface says "anything" somewhere. Each share is reported per package and in total, and the
command exits 1 when a total is above its bound.

    python tools/any_share.py rewardq                   # bare Any bounded at 4 %
    python tools/any_share.py --max-signature 8 rewardq # and signatures naming Any at 8 %
    python tools/any_share.py --max 100 tests benchmarks # report only
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_PERCENT = 4.0
#: No bound on the signature share unless one is asked for (``--max-signature``).
DEFAULT_MAX_SIGNATURE_PERCENT = 100.0


@dataclass
class Count:
    """How many annotations a piece of code has, and how many of them are a bare ``Any``."""

    annotations: int = 0
    bare_any: int = 0
    signatures: int = 0
    signatures_with_any: int = 0

    def add(self, other: Count) -> None:
        self.annotations += other.annotations
        self.bare_any += other.bare_any
        self.signatures += other.signatures
        self.signatures_with_any += other.signatures_with_any

    @property
    def percent(self) -> float:
        return 100.0 * self.bare_any / self.annotations if self.annotations else 0.0

    @property
    def signature_percent(self) -> float:
        return 100.0 * self.signatures_with_any / self.signatures if self.signatures else 0.0


def is_bare_any(node: ast.expr) -> bool:
    """``Any``, ``typing.Any`` / ``t.Any``, or the same written as a string."""
    if isinstance(node, ast.Name):
        return node.id == "Any"
    if isinstance(node, ast.Attribute):
        return node.attr == "Any" and isinstance(node.value, ast.Name)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            parsed = ast.parse(node.value.strip(), mode="eval").body
        except SyntaxError:
            return False
        return not isinstance(parsed, ast.Constant) and is_bare_any(parsed)
    return False


def names_any(node: ast.expr) -> bool:
    """Whether ``Any`` appears anywhere in the annotation (``dict[str, Any]``, ``"Any | None"``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value.strip(), mode="eval").body
        except SyntaxError:
            return False
    return any(is_bare_any(sub) for sub in ast.walk(node) if isinstance(sub, ast.expr))


def _annotations(tree: ast.AST) -> Iterator[tuple[ast.expr, bool]]:
    """Every annotation, and whether it is part of a signature (a parameter's or a return's)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None and arg.annotation is not None:
                    yield arg.annotation, True
            if node.returns is not None:
                yield node.returns, True
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation, False


def count_source(source: str, filename: str = "<source>") -> Count:
    """Count the annotations of one module's source text."""
    count = Count()
    for annotation, in_signature in _annotations(ast.parse(source, filename=filename)):
        count.annotations += 1
        count.bare_any += is_bare_any(annotation)
        if in_signature:
            count.signatures += 1
            count.signatures_with_any += names_any(annotation)
    return count


def package_of(path: Path, root: Path) -> str:
    """The dotted package a file belongs to: ``rewardq/queue/broker.py`` -> ``rewardq.queue``."""
    parts = path.relative_to(root.parent).parts if root.is_dir() else (path.stem,)
    return ".".join(parts[:-1]) if len(parts) > 1 else parts[0].removesuffix(".py")


def count_paths(paths: Sequence[Path]) -> dict[str, Count]:
    """Counts per package (a file's directory, dotted) for every ``.py`` file under ``paths``."""
    per_package: dict[str, Count] = {}
    for root in paths:
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for file in files:
            if any(part.startswith(".") or part == "__pycache__" for part in file.parts):
                continue
            package = package_of(file, root)
            per_package.setdefault(package, Count()).add(count_source(file.read_text(), str(file)))
    return per_package


def report(per_package: dict[str, Count]) -> tuple[list[str], Count]:
    """Lines of the table and the total."""
    total = Count()
    width = max((len(name) for name in per_package), default=5)
    lines = [f"{'package':<{width}}  annotations  bare Any  share    signatures  naming Any  share"]
    for name in sorted(per_package):
        count = per_package[name]
        total.add(count)
        lines.append(_row(name, width, count))
    lines.append(_row("total", width, total))
    return lines, total


def _row(name: str, width: int, c: Count) -> str:
    return (
        f"{name:<{width}}  {c.annotations:>11}  {c.bare_any:>8}  {c.percent:5.1f} %  "
        f"{c.signatures:>10}  {c.signatures_with_any:>10}  {c.signature_percent:5.1f} %"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("paths", nargs="+", type=Path, help="packages (directories) or files to measure")
    parser.add_argument(
        "--max",
        type=float,
        default=DEFAULT_MAX_PERCENT,
        metavar="PERCENT",
        help=f"fail (exit 1) when the total share is above this (default {DEFAULT_MAX_PERCENT:g})",
    )
    parser.add_argument(
        "--max-signature",
        type=float,
        default=DEFAULT_MAX_SIGNATURE_PERCENT,
        metavar="PERCENT",
        help="fail (exit 1) when the share of signature annotations naming Any is above this (default: no bound)",
    )
    parser.add_argument("--quiet", action="store_true", help="print the total line only")
    args = parser.parse_args(argv)
    lines, total = report(count_paths(args.paths))
    print("\n".join(lines[-1:] if args.quiet else lines))
    code = 0
    if total.percent > args.max:
        print(f"bare Any is {total.percent:.1f} % of annotations, above the bound of {args.max:g} %", file=sys.stderr)
        code = 1
    if total.signature_percent > args.max_signature:
        print(
            f"{total.signature_percent:.1f} % of signature annotations name Any, above the bound of "
            f"{args.max_signature:g} %",
            file=sys.stderr,
        )
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())

"""tools/any_share.py counts parameter, return and variable annotations, and the bare ``Any`` among them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.any_share import count_paths, count_source, is_bare_any, main

SAMPLE = """
import typing
from typing import Any

def f(a: Any, b: int, *args: Any, c: "Any" = 1, **kw: typing.Any) -> Any:
    x: Any = a
    y: dict[str, Any] = {}
    z: Any | None = None
    return x

class C:
    attr: "dict[str, Any]"

    def m(self, v: list[Any]) -> None:
        pass

    async def n(self, w) -> typing.Any:
        return w

lam = lambda q: q
"""


def test_counts_every_kind_of_annotation_and_only_the_bare_any() -> None:
    # Given a sample whose annotations are counted by hand:
    #   f: a, b, *args, c, **kw, return = 6 (bare: a, *args, c, **kw, return = 5)
    #   body: x, y, z = 3 (bare: x = 1); C.attr = 1; m: v, return = 2; n: return = 1 (bare: 1)
    count = count_source(SAMPLE)
    assert count.annotations == 13
    assert count.bare_any == 7
    assert count.percent == pytest.approx(100 * 7 / 13)


def test_bare_any_recognises_names_attributes_and_strings_only() -> None:
    import ast

    def ann(text: str) -> ast.expr:
        return ast.parse(text, mode="eval").body

    assert is_bare_any(ann("Any")) and is_bare_any(ann("typing.Any")) and is_bare_any(ann("'Any'"))
    assert not is_bare_any(ann("list[Any]")) and not is_bare_any(ann("Any | None"))
    assert not is_bare_any(ann("'list[Any]'")) and not is_bare_any(ann("object"))


def test_per_package_counts_and_the_bound_set_the_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("def f(a: int) -> int:\n    return a\n")
    (pkg / "sub" / "__init__.py").write_text("from typing import Any\ndef g(a: Any) -> None:\n    pass\n")

    per_package = count_paths([pkg])
    assert {name: (c.annotations, c.bare_any) for name, c in per_package.items()} == {
        "pkg": (2, 0),
        "pkg.sub": (2, 1),
    }
    # 1 of 4 is 25 %: above the default 4 % bound, within a 30 % one
    assert main([str(pkg)]) == 1
    out = capsys.readouterr()
    assert "25.0 %" in out.out and "above the bound of 4 %" in out.err
    assert main(["--max", "30", str(pkg)]) == 0


def test_signature_share_counts_parameters_and_returns_that_name_any_anywhere() -> None:
    # Given the same sample, signatures only (variables left out):
    #   f: a, b, *args, c, **kw, return = 6 (naming Any: all but b = 5); m: v, return = 2 (v = 1);
    #   n: return = 1 (1)
    count = count_source(SAMPLE)
    assert count.signatures == 9
    assert count.signatures_with_any == 7
    assert count.signature_percent == pytest.approx(100 * 7 / 9)


def test_the_signature_bound_sets_the_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.py"
    src.write_text("from typing import Any\ndef f(a: dict[str, Any], b: int) -> None:\n    pass\n")
    # a, b and the return: one of three names Any (33 %), and none is a bare Any
    assert main(["--max-signature", "30", str(src)]) == 1
    assert "33.3 % of signature annotations name Any" in capsys.readouterr().err
    assert main(["--max-signature", "40", str(src)]) == 0

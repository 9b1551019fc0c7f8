"""The documentation holds together: every relative link and anchor in README.md and docs/ resolves,
and docs/keyspace.md lists exactly the keys rewardq.queue.keys builds."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from rewardq.queue.keys import Keyspace

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "deploy").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def _prose(text: str) -> str:
    """The page without its code blocks and inline code (links there are examples, not links)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links() -> list[tuple[Path, str]]:
    out = []
    for page in PAGES:
        for target in LINK.findall(_prose(page.read_text())):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
                out.append((page, target))
    return out


def test_the_pages_have_relative_links_to_check() -> None:
    assert len(links()) > 30 and any("#" in t for _, t in links())


@pytest.mark.parametrize(("page", "target"), links(), ids=lambda v: v if isinstance(v, str) else v.name)
def test_every_relative_link_and_anchor_resolves(page: Path, target: str) -> None:
    path, _, fragment = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), f"{page.relative_to(REPO)} links {target!r}: {dest} does not exist"
    assert REPO in dest.parents or dest == REPO, f"{page.relative_to(REPO)} links {target!r} outside the repository"
    if fragment and dest.suffix == ".md":
        assert fragment in anchors(dest), (
            f"{page.relative_to(REPO)} links {target!r}: no heading or anchor #{fragment} in "
            f"{dest.relative_to(REPO)} (it has {sorted(anchors(dest))})"
        )


def test_the_slug_rules_match_githubs() -> None:
    assert github_slug("Operating it") == "operating-it"
    assert github_slug("`rewardq status`: what is waiting for what") == "rewardq-status-what-is-waiting-for-what"
    assert github_slug("Keyspace and wire format") == "keyspace-and-wire-format"


# -- the keyspace page against rewardq.queue.keys -----------------------------------------------
PLACEHOLDER = {
    "shard": 0,
    "tid": "<uid>_<session_id>",
    "key": "<uid>_<session_id>_<i>",
    "name": "<name>",
    "token": "<token>",
    "digest": "<sha256>",
    "run": "<run>",
    "nonce": "<nonce>",
    "worker": "<worker>",
}


def code_keys() -> set[str]:
    """Every key a Keyspace method or property builds, with the documented placeholders."""
    ks = Keyspace("<ns>")
    out = set()
    for attr, member in inspect.getmembers(Keyspace):
        if attr.startswith("_") or attr.endswith(("_prefix", "_key")) or attr.startswith("shard_of"):
            continue  # prefixes and conveniences build the same keys as the methods they wrap
        if isinstance(member, property):
            out.add(getattr(ks, attr))
        elif inspect.isfunction(member):
            params = list(inspect.signature(member).parameters)[1:]
            out.add(member(ks, *(PLACEHOLDER[p] for p in params)))
    # a method returning a prefix (``staged``) builds ``<prefix><i>`` keys
    return {k + "<i>" if k.endswith(":") else k for k in out if isinstance(k, str)}


def documented_keys() -> set[str]:
    text = (REPO / "docs" / "keyspace.md").read_text()
    return set(re.findall(r"^\| `(<ns>:[^`]+)` \|", text, re.M))


def test_keyspace_md_lists_every_key_the_code_builds_and_no_other() -> None:
    code, docs = code_keys(), documented_keys()
    assert "<ns>:{s0}:records:<uid>_<session_id>" in code
    assert docs == code, f"only in code: {sorted(code - docs)}; only in docs/keyspace.md: {sorted(docs - code)}"


def test_the_keys_module_docstring_names_every_key_too() -> None:
    import rewardq.queue.keys as keys

    doc = keys.__doc__ or ""
    for key in code_keys():
        kind = key.replace("<ns>", "rewardq").split(":<")[0]
        assert kind in doc, f"rewardq/queue/keys.py's docstring does not name {key}"


def test_the_license_is_an_spdx_expression() -> None:
    """``license = "Apache-2.0"``: the table form makes setuptools warn on every install."""
    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with tomllib (Python 3.11+)")

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"

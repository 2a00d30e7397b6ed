"""The README and the documentation site: the README stays a newcomer's few minutes, the site builds with
``mkdocs build --strict`` (every link between pages resolves, every page is in the nav, every included file
exists), and the links and make targets they name are real."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 300


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def _nav_pages(nav: object) -> list[str]:
    """The page files a mkdocs nav names, at any depth."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def _config() -> dict[str, object]:
    # mkdocs.yml's `!relative` tag is mkdocs' own; plain YAML only needs the nav.
    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    config: dict[str, object] = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), _Loader)
    return config


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: move the detail to a page under docs/"
    )


def test_the_readme_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [target for target in targets if "://" not in target]
    assert any(target.startswith("docs/") for target in local)
    missing = [target for target in local if not (ROOT / target).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_page_is_in_the_nav() -> None:
    named = _nav_pages(_config()["nav"])
    assert len(named) == len(set(named)), "a page is in the nav twice"
    assert sorted(named) == sorted(page.name for page in _pages())


def test_every_make_target_named_exists() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.MULTILINE))
    named: dict[str, str] = {}
    for path in [README, *_pages()]:
        for target in re.findall(r"`make ([a-z][a-z0-9-]*)", path.read_text(encoding="utf-8")):
            named.setdefault(target, path.name)
    assert {"run", "test", "docs"} <= set(named)
    unknown = {target: where for target, where in named.items() if target not in targets}
    assert not unknown, f"make targets the docs name that the Makefile does not have: {unknown}"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    warnings = [line for line in result.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert result.returncode == 0, "\n".join(warnings) or result.stderr[-2000:]
    for page in _pages():
        built = tmp_path / "site" / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), f"{page.name} was not built"

"""The docs site: its generated reference covers every setting, command, public name and
package; every page is in its nav; every code block is of a kind the tests run or check;
the README stays a front door. (``make docs`` builds it; CI with ``--strict``.)
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import sys
from pathlib import Path

import docs_hooks
import pytest

import rmqdelay
from tests.helpers.readme_blocks import (
    BLOCKS,
    DOCS,
    LANGUAGES,
    OWN_RUNNER,
    PYTHON_BLOCKS,
    README,
    ROOT,
    TOML_BLOCKS,
    Block,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]


def test_the_readme_is_a_front_door() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_every_block_is_of_a_kind_the_tests_run_or_check() -> None:
    odd = [(b.id, b.language) for b in BLOCKS if b.language not in LANGUAGES]
    assert not odd, f"blocks of a language no test runs (write them as text?): {odd}"
    for document, runner in OWN_RUNNER.items():
        assert (ROOT / document).exists() and (ROOT / runner).exists(), document


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_python_blocks_compile(block: Block) -> None:
    # tests/broker/test_readme.py runs them; this says which one is broken without a broker
    ast.parse(block.code, filename=block.id)


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=[b.id for b in TOML_BLOCKS])
def test_toml_blocks_are_settings_files(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tomllib.loads(block.code)
    path = tmp_path / "rmqdelay.toml"
    path.write_text(block.code, encoding="utf-8")
    for name in [n for n in os.environ if n.startswith("RMQDELAY_")]:
        monkeypatch.delenv(name)  # the file's values, not the test run's
    settings = rmqdelay.load_settings(path)  # refuses a key it does not know
    assert table and all(hasattr(settings, key) for key in table), block.id
    assert settings.prefix == table.get("prefix", "rmqdelay"), block.id


def test_the_settings_reference_names_every_setting() -> None:
    table = docs_hooks.settings_reference()
    fields = [f.name for f in dataclasses.fields(rmqdelay.Settings)]
    assert {s.name for s in docs_hooks.settings_fields()} == set(fields)
    for name in fields:
        assert f"| `{name}` | `RMQDELAY_{name.upper()}` |" in table, name
    undescribed = [s.name for s in docs_hooks.settings_fields() if not s.description]
    assert not undescribed, f"settings with no description (a docstring): {undescribed}"
    page = (DOCS / "reference" / "settings.md").read_text(encoding="utf-8")
    assert docs_hooks.SETTINGS_MARK in page


def test_the_cli_reference_is_every_command() -> None:
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert "::: mkdocs-click\n    :module: rmqdelay.cli\n    :command: app\n" in page
    commands = docs_hooks.cli_commands()
    assert {"rmqdelay publish", "rmqdelay topology apply", "rmqdelay recurring add"} <= set(
        commands
    )
    # the docs extra: CI's .venv has it (make docs runs first), make test-deps' venvs not
    docs = pytest.importorskip("mkdocs_click._docs", reason="no docs extra (make docs)")
    make_command_docs = docs.make_command_docs
    from rmqdelay.cli import app

    rendered = "\n".join(make_command_docs("rmqdelay", app, depth=1, style="plain"))
    usages = set(re.findall(r"^(rmqdelay[\w -]*?) \[OPTIONS\]", rendered, flags=re.M))
    assert set(commands) <= usages, sorted(set(commands) - usages)


def test_the_api_reference_is_every_public_name() -> None:
    page = docs_hooks.api_reference()
    documented = set(re.findall(r"^::: rmqdelay\.(\w+)$", page, flags=re.M))
    assert set(rmqdelay.__all__) <= documented, sorted(set(rmqdelay.__all__) - documented)
    assert "::: rmqdelay.testing\n" in page
    assert docs_hooks.API_MARK in (DOCS / "reference" / "api.md").read_text(encoding="utf-8")


def test_the_architecture_names_every_package_and_maps_every_module() -> None:
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    missing = [p for p in docs_hooks.packages() if f"- `{p}`" not in page]
    assert not missing, f"docs/architecture.md says nothing of {missing}"
    assert docs_hooks.MODULES_MARK in page
    generated = docs_hooks.module_map()
    for module in (ROOT / "rmqdelay").rglob("*.py"):
        if module.name != "__init__.py":
            assert f"| `{module.stem}` |" in generated, module


def test_every_page_is_in_the_nav() -> None:
    nav = set(re.findall(r":\s+(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages == nav, (sorted(pages - nav), sorted(nav - pages))


def test_the_readmes_links_lead_somewhere() -> None:
    """The README is not built with the site (whose build checks its own links)."""
    text = README.read_text(encoding="utf-8")
    links = [link for link in re.findall(r"\]\(([^)]+)\)", text) if "://" not in link]
    assert links
    missing = [link for link in links if not (ROOT / link.split("#")[0]).exists()]
    assert not missing, missing

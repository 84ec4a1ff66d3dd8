"""The docs folder as a reader meets it: an index page with one line per page (none missing, none
dangling), a configuration reference that is what the Config field docstrings generate now, and
relative links between pages that resolve."""

from __future__ import annotations

import re
from pathlib import Path

from grpolab.app import docs_config

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_index_lists_every_page_once():
    index = (DOCS / "README.md").read_text()
    linked = re.findall(r"^\| \[([\w.-]+\.md)\]\(\1\) \|", index, flags=re.M)
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "README.md")
    assert sorted(linked) == pages, f"docs/README.md lists {sorted(linked)}, the folder holds {pages}"


def test_configuration_reference_is_current():
    assert (DOCS / "configuration.md").read_text() == docs_config.render(), (
        "docs/configuration.md is not current: run `python -m grpolab.app.docs_config`"
    )


def test_configuration_reference_names_every_nested_key():
    from grpolab.training.config import Config

    text = (DOCS / "configuration.md").read_text()
    for key in ("algo.beta", "lora.r", "rollout.engine", "env.max_turns", "G", "lr"):
        assert f"| `{key}` |" in text, key
    assert Config.__dataclass_fields__  # the page is made from this class


def test_check_mode_reports_a_stale_page(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text("old\n")
    assert docs_config.main(["--out", str(stale), "--check"]) == 1
    assert docs_config.main(["--out", str(stale)]) == 0
    assert docs_config.main(["--out", str(stale), "--check"]) == 0


def test_relative_links_between_pages_resolve():
    broken = []
    for page in DOCS.glob("*.md"):
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))  # not code
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.name}: {target}")
    assert not broken, broken

"""The committed ``docs/formats/*.md`` pages are exactly what ``python -m edgecap.runtime.schema_docs`` generates
from the schemas, so a schema change without regenerating them fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecap.runtime import schema_docs
from edgecap.runtime.schema import load_schema

DOCS = Path(__file__).resolve().parents[2] / "docs" / "formats"


@pytest.mark.parametrize("name", sorted(schema_docs.FORMATS))
def test_the_committed_page_is_the_generated_one(name: str) -> None:
    committed = (DOCS / f"{name}.md").read_text(encoding="utf-8")
    assert committed == schema_docs.render(name), (
        f"docs/formats/{name}.md is stale: run python -m edgecap.runtime.schema_docs"
    )


@pytest.mark.parametrize("name", sorted(schema_docs.FORMATS))
def test_every_field_of_the_schema_is_on_its_page(name: str) -> None:
    schema = load_schema(str(Path(schema_docs.__file__).resolve().parents[1] / schema_docs.FORMATS[name]))
    page = schema_docs.render(name)
    for part in [schema, *schema.get("$defs", {}).values()]:
        for field, sub in part.get("properties", {}).items():
            assert f"`{field}`" in page or f".{field}`" in page
            assert sub.get("description"), f"{name}: {field} has no description"


def test_check_mode_reports_stale_pages_and_writes_nothing(tmp_path: Path) -> None:
    assert schema_docs.main(["--out", str(tmp_path), "--check"]) == 1
    assert not any(tmp_path.iterdir())
    assert schema_docs.main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.md", "report.md"]
    assert schema_docs.main(["--out", str(tmp_path), "--check"]) == 0

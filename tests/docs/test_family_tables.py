"""docs/weights.md's family tables are the text model/families/docs.py generates from the families' own
tables (rerun `python -m mimo_jobs.model.families.docs --write` after changing a family)."""

from __future__ import annotations

from helpers import REPO
from mimo_jobs.model.families import docs

PAGE = REPO / "docs" / "weights.md"


def test_the_committed_tables_are_the_generated_ones():
    page = PAGE.read_text()
    assert page.count(docs.BEGIN) == 1 and page.count(docs.END) == 1, "docs/weights.md lost its markers"
    assert docs.replaced(page) == page, (
        "docs/weights.md's family tables differ from the families: run "
        "`python -m mimo_jobs.model.families.docs --write`"
    )


def test_the_check_can_fail():
    page = PAGE.read_text().replace("`lm_head.weight`", "`lm_head.w`", 1)
    assert docs.replaced(page) != page

"""The causes the report gives for a deviation quote measured numbers: each number a section of
docs/reproduction/deviations.md cites from a committed record is the record's, and each target's cause is
a section of that page."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from normfl.reproduce import targets
from tests.helpers import REPO

PAGE = REPO / targets.DEVIATIONS
READS = {  # what a citation's "reads" column takes from a record's summary
    "final test accuracy": lambda s: 100 * s["final_test_acc"],
    "best test accuracy": lambda s: 100 * s["best_test_acc"],
    "last-5 test error": lambda s: 100 - 100 * s["last5_mean_test_acc"],
    "steps taken": lambda s: s["privacy"]["steps_taken"],
}


def sections() -> dict[str, str]:
    parts = re.split(r"^## (.+)$", PAGE.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def citations():
    for title, body in sections().items():
        prose = body.split("| quoted |")[0]
        for row in re.findall(r"^\| (?!quoted|---)(.+) \|$", body, flags=re.M):
            quoted, keys, reads = (c.strip() for c in row.split("|"))
            yield pytest.param(prose, quoted, keys.split(), reads, id=f"{title[:20]}: {quoted}")


def _rendered(values: list[float], quoted: str) -> str:
    """The values written as the page writes them: with the quoted number's decimals, mean ± sd for several."""
    decimals = len(quoted.split()[0].partition(".")[2])
    if len(values) == 1:
        return f"{values[0]:.{decimals}f}"
    return f"{statistics.mean(values):.{decimals}f} ± {statistics.stdev(values):.{decimals}f}"


@pytest.mark.parametrize("prose, quoted, keys, reads", list(citations()))
def test_a_cited_number_is_its_records(prose, quoted, keys, reads):
    assert reads in READS, f"unknown 'reads' {reads!r}; allowed: {', '.join(READS)}"
    values = [READS[reads](json.loads((REPO / "outputs/records" / k / "summary.json").read_text())) for k in keys]
    assert _rendered(values, quoted) == quoted, f"{keys} give {_rendered(values, quoted)}, the page says {quoted}"
    assert quoted in prose, f"{quoted} is cited but not quoted in its section's text"


def test_every_cause_is_a_section_and_every_section_a_cause():
    causes = {t.cause for t in targets.TARGETS.values() if t.cause}
    assert causes == set(sections()), (causes ^ set(sections()))


def test_each_section_cites_what_it_can():
    cited = {title for title, body in sections().items() if "| quoted |" in body}
    assert len(list(citations())) >= 25 and cited == set(sections()) - {targets.NFA_T5_CAUSE}

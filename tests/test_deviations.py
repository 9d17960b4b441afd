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


def test_the_table_of_normec_t2s_beta_0_1_cells_quotes_its_records_as_what_they_are():
    """docs/measurements.md's one table of NORMEC-T2's β = 0.1 cells (issue 67.6: one cell's numbers were quoted
    on four pages, two of them the other cell's): each row sourced from a record gives the record's final and best
    accuracy, and the record is that cell (SN or not, β = 0.1, its γ, the text profile)."""
    import yaml

    page = (REPO / "docs" / "measurements.md").read_text()
    section = page.split("## NORMEC-T2's β = 0.1 cells: every number, one place")[1].split("\n## ")[0]
    recorded = 0
    for row in re.findall(r"^\| (?!cell|---)(.+) \|$", section, flags=re.M):
        cell, gamma, *_, accuracy, source = (c.strip() for c in row.split("|"))
        if not source.startswith("record "):
            continue
        key = source.split()[1]
        summary = json.loads((REPO / "outputs/records" / key / "summary.json").read_text())
        config = yaml.safe_load((REPO / "outputs/records" / key / "config.yaml").read_text())
        assert accuracy == f"{100 * summary['final_test_acc']:.2f}% ({100 * summary['best_test_acc']:.2f}%)", row
        assert config["algo"]["server_norm"] == cell.startswith("SN") and config["algo"]["beta"] == 0.1, row
        assert config["algo"]["gamma"] == float(gamma) and config["profile"] == "text", row
        recorded += 1
    assert recorded == 3

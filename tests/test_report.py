"""The report is a pure function of the committed records: REPRODUCTION.md and the tables of
docs/reproduction/<profile>/ come out of `outputs/records` exactly as committed (figures are compared by
their tables, the data they draw), and a record or a table changed by hand shows."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest

from normfl.reproduce import figures, jobs, records, report, targets
from tests.helpers import REPO

pytestmark = pytest.mark.slow            # the first report a worker draws takes 16 s, whichever test it is

COMMITTED = REPO / "outputs" / "records"
TABLES = (".md", ".csv")


def tables(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for profile in jobs.PROFILES
            for p in sorted((root / profile).glob("*")) if p.suffix in TABLES}


def redraw(out: Path, store: Path, ids=None) -> None:
    for t in ids or targets.TARGETS.values():
        for profile in jobs.PROFILES:
            if jobs.has_profile(t.grid, profile):
                figures.draw(t, profile, store, out=out, images=False)


@pytest.fixture
def committed(monkeypatch):
    monkeypatch.setattr(records, "RECORDS", COMMITTED)           # the tests' own records are elsewhere


def test_report_and_tables_are_what_the_records_give(committed, tmp_path):
    empty = tmp_path / "no-store"                                # a fresh clone has no working store
    report.write(empty, tmp_path / "REPRODUCTION.md")
    assert (tmp_path / "REPRODUCTION.md").read_text() == (REPO / "REPRODUCTION.md").read_text()
    redraw(tmp_path / "docs", empty)
    assert tables(tmp_path / "docs") == tables(REPO / "docs" / "reproduction")
    for profile in jobs.PROFILES:                                # no figure outlives its table
        folder = REPO / "docs" / "reproduction" / profile
        assert {p.stem for p in folder.glob("*.png")} <= {p.stem for p in folder.glob("*.csv")}


def test_a_record_changed_by_hand_changes_the_report(monkeypatch, tmp_path):
    if not any(COMMITTED.glob("*/summary.json")):
        pytest.skip("no committed record yet")
    changed = tmp_path / "records"
    shutil.copytree(COMMITTED, changed)
    rec = next(changed.glob("*/summary.json")).parent
    summary = json.loads((rec / "summary.json").read_text())
    rows = lzma.decompress((rec / "metrics.csv.xz").read_bytes()).decode().splitlines()
    header = rows[0].split(",")
    for i in range(len(rows) - 5, len(rows)):                    # the last evaluations, 1 point worse
        cells = rows[i].split(",")
        acc = header.index("test_acc")
        if cells[acc]:
            cells[acc] = f"{float(cells[acc]) - 0.01:.9g}"
        rows[i] = ",".join(cells)
    (rec / "metrics.csv.xz").write_bytes(lzma.compress(("\n".join(rows) + "\n").encode()))
    summary["last5_mean_test_acc"] -= 0.01
    summary["final_test_acc"] -= 0.01
    (rec / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    monkeypatch.setattr(records, "RECORDS", changed)
    ids = [t for t in targets.TARGETS.values() if any(j.key == rec.name for p in jobs.PROFILES
                                                       if jobs.has_profile(t.grid, p) for j in jobs.jobs(t.grid, p))]
    assert ids
    redraw(tmp_path / "docs", tmp_path / "no-store", ids)
    ours = tables(tmp_path / "docs")
    theirs = {k: v for k, v in tables(REPO / "docs" / "reproduction").items() if k in ours}
    assert ours.keys() == theirs.keys() and ours != theirs


def test_make_figures_redraws_only_the_named_ids_in_each_of_their_profiles(committed, tmp_path, monkeypatch):
    """`make figures IDS="normfedavg-t3 alidpfl-t2"`: those IDs' tables, from the records alone, as committed; no
    other ID's (without IDS, every ID's)."""
    import subprocess

    from normfl.reproduce.__main__ import main

    def make(*ids):          # the command `make figures` runs (under make test too, which adds its own lines)
        out = subprocess.run(["make", "-n", "--no-print-directory", "figures", *([f"IDS={' '.join(ids)}"] if ids
                                                                                 else [])],
                             cwd=REPO, capture_output=True, text=True).stdout
        return [line.strip() for line in out.splitlines() if "normfl.reproduce figures" in line]

    assert make("normfedavg-t3", "alidpfl-t2")[0].endswith("-m normfl.reproduce figures --all-profiles normfedavg-t3 "
                                                          "alidpfl-t2")
    assert make()[0].endswith("-m normfl.reproduce figures --all-profiles")
    real, out = figures.draw, tmp_path / "docs"
    monkeypatch.setattr(figures, "draw", lambda t, profile, store, **_: real(t, profile, store, out=out))
    (tmp_path / "store").mkdir()                                # an empty one: a fresh clone has none
    main(["figures", "--all-profiles", "normfedavg-t3", "alidpfl-t2", "--store", str(tmp_path / "store")])
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*.*"))
    assert written == ["code/alidpfl-t2.csv", "code/alidpfl-t2.md", "paper/alidpfl-t2.csv", "paper/alidpfl-t2.md",
                       "paper/normfedavg-t3.csv", "paper/normfedavg-t3.md"]
    assert tables(out) == {k: v for k, v in tables(REPO / "docs" / "reproduction").items() if k in written}

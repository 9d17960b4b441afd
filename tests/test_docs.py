"""What a user reads stands on its own: nothing in the README, REPRODUCTION.md, docs/, the code, the
scripts or the configs cites an internal design document or a file outside the repository (the offline-data default
aside); the papers' ambiguities are cited as entries of docs/readings.md, and every entry cited exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READ = ["README.md", "REPRODUCTION.md", "Makefile", "train.py", *(f"{d}/**/*.{ext}" for d in ("docs", "normfl",
        "scripts", "conf") for ext in ("md", "py", "yaml", "csv"))]


def files() -> list[Path]:
    return sorted({p for pattern in READ for p in REPO.glob(pattern) if p.is_file()})


def test_nothing_cites_a_spec_or_a_file_outside_the_repository():
    bad = []
    for path in files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            outside = "../shared" in line and "offline" not in line.lower() and "NORMFL_OFFLINE_DATA" not in line
            if re.search(r"\bspecs?\b", line, re.I) or outside:
                bad.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad[:20])


def test_every_reading_cited_has_an_entry():
    entries = set(re.findall(r"^### ((?:C-)?[AN]?-?\w+):", (REPO / "docs" / "readings.md").read_text(), re.M))
    cited = {m for path in files() for m in re.findall(r"\breadings? ((?:C-[AN]|A)\d+)\b", path.read_text())}
    assert cited and cited <= entries, sorted(cited - entries)

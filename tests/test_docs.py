"""What a user reads stands on its own: nothing in the README, REPRODUCTION.md, docs/, the code, the
scripts or the configs cites an internal design document or a file outside the repository (the offline-data default
aside); the papers' ambiguities are cited as entries of docs/readings.md, and every entry cited exists; every
single run the pages tell a user to make is a valid config."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.helpers import CONF, REPO

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


# Documented commands that cannot be checked on a CPU-only machine without their context: a GPU, the user's own
# file, a sweep (test_readme runs the README's), or settings stated once beside a generated list (docs/audit.md)
CONTEXT = ("device=cuda", "dataset=npz", "-m ", ",")
GENERATED = ("docs/audit.md", "docs/privacy-table.md")


def documented_runs() -> list[tuple[str, list[str]]]:
    """(where, overrides) of every single run a user reads as ``python train.py ...`` in the README, REPRODUCTION.md,
    docs/ (not the archive) and the experiment files."""
    runs, pages = [], [REPO / "README.md", REPO / "REPRODUCTION.md", *REPO.glob("docs/**/*.md"),
                       *REPO.glob("conf/**/*.yaml")]
    for path in pages:
        where = str(path.relative_to(REPO))
        if "archive" in path.parts or where in GENERATED:
            continue
        text = path.read_text().replace("\\\n", " ")
        for m in re.finditer(r"python train\.py((?:[ \t]+(?:\"[^\"]*\"|'[^']*'|[^\s`|#)\[\]]+))*)", text):
            command = " ".join(m[1].split())
            words = shlex.split(command)
            if not any(c in f"{command} " for c in CONTEXT) and all("=" in w and "..." not in w for w in words):
                runs.append((where, words))                              # not a placeholder such as [overrides]
    return runs


@pytest.mark.slow
def test_every_documented_run_is_a_valid_config():
    """Each ``python train.py ...`` a user can copy from the docs composes and validates, so a tightened check
    cannot refuse what a page tells them to run (``experiment=alidpfl_authors_code dataset.scale=raw`` once was)."""
    from hydra import compose, initialize_config_dir

    from normfl.config import ConfigError, validate

    runs, bad = documented_runs(), []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for where, overrides in runs:
            try:
                validate(compose("config", overrides=overrides))
            except ConfigError as err:
                bad.append(f"{where}: python train.py {' '.join(overrides)}: {err}")
    assert len(runs) >= 20 and not bad, "\n".join(bad)

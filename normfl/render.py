"""Tables and figures as normfl writes them, whoever draws: a sweep's table of jobs (``normfl.table``),
``python -m normfl.collect`` and the reproduction's figures and tables (``normfl.reproduce.figures``). Cells in
markdown, a run's per-round table read once, a figure written without timestamps (titled where its caller asks);
matplotlib draws off-screen (Agg), so a figure needs no display."""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "normfl"       # an SVG's ids from its content alone, not a random salt
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from normfl.results import metrics_file  # noqa: E402


def fmt(v) -> str:
    """A table cell: numbers with two decimals (two significant digits below 0.1, so that β = 0.001
    is not printed as 0.00), "–" where there is none."""
    if v is None or pd.isna(v):
        return "–"
    if not isinstance(v, float):
        return str(v)
    return f"{v:.2f}" if v == 0 or abs(v) >= 0.1 else f"{v:.2g}"


def markdown_table(table: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


@functools.cache
def curve(run_dir: Path) -> pd.DataFrame:
    """A finished run's metrics, from a run directory or a record (read once per process: figures and the
    report share runs; callers must not modify the frame)."""
    return pd.read_csv(metrics_file(run_dir))


def round_axis(readings: set) -> str:
    """What a curve's x-axis counts where it is the round, by the runs' readings: passes over each client's shard
    (``reading=pass``, as the papers draw them) or communication rounds of one step each."""
    if readings == {"pass"}:
        return "pass over each client's shard"
    return "communication round" if readings == {"text"} else "round (pass or step: mixed readings)"


def save(fig, path: Path, title: str | None = None, note: str = "", suffixes=(".png", ".pdf")) -> list[Path]:
    """Write ``fig`` as ``path`` with each of ``suffixes`` and close it; ``title`` and ``note`` above it where
    given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    width = int(fig.get_figwidth() * 15)                # characters of 8 pt type across the figure
    if title or note:
        fig.suptitle("\n".join([*filter(None, [title]), *textwrap.wrap(note.replace("**", ""), width)]), fontsize=8)
    fig.tight_layout()
    out = [path.with_suffix(s) for s in suffixes]
    for p in out:                        # no timestamps: a redraw of the same runs is byte-identical
        fig.savefig(p, dpi=120, metadata={".pdf": {"CreationDate": None}, ".svg": {"Date": None}}.get(p.suffix, {}))
    plt.close(fig)
    return out

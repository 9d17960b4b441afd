"""``REPRODUCTION.md``: for every figure and table, where the reproduction stands, from stored runs."""

from __future__ import annotations

from pathlib import Path

from normfl.reproduce import figures, store, targets
from normfl.reproduce.figures import fmt

HEADER = """# Reproduction status

Written by `make report` from the runs stored in `outputs/store` (not in git); the figures and
tables are in `docs/reproduction/<profile>/`, written by `make <id>` or `make figures`. Every number
is measured here (2 CPU cores, no GPU) by the command shown. Profiles:

- **paper**: the papers' settings (spec `../shared/spec`); test accuracy is evaluated every 10 rounds
  (NORMEC, FEDNORMEC) or 5 rounds (ALI-DPFL) and at the last round, instead of every round (the
  spec's resolution), to save time; tables reading the final round are unaffected, "highest
  accuracy" cells are maxima over the evaluated rounds.
- **quick**: a scaled version for this CPU (fewer rounds, grid points and seeds; a test subset),
  defined in the experiment files' `quick:` blocks. Its numbers are not compared with the paper's.

Data: CIFAR-10 results come from the JPEG copy in `../shared/data` (labelled so in every run's
summary); Fashion-MNIST is exact. Status, from the paper profile's runs: **reproduced** (every
compared number within the tolerance), **deviates** (cause given), **partial** (some runs of the grid
not trained yet; the comparison covers the stored ones), **drawn** (the paper prints no number for
it), **quick profile only**, **not run**. Wall times are the sum over a grid's stored runs.
"""


def _status(df, comp, tol) -> str:
    """The paper profile's status from its runs and their comparison with the paper."""
    if df.empty or not df.status.isin(store.FINISHED).any():
        return "not run"
    if not df.status.isin(store.FINISHED).all():
        return f"partial ({df.status.isin(store.FINISHED).sum()}/{len(df)} runs)"
    diffs = comp.dropna(subset=["ours", "paper"])["diff"].abs()
    if diffs.empty:
        return "drawn (the paper prints no numbers for it)"
    return "reproduced" if (diffs <= tol).all() else "deviates"


def _runs(df) -> str:
    done = df[df.status.isin(store.FINISHED)]
    wall = done["wall"].sum() / 60 if "wall" in done and len(done) else 0.0
    return f"{len(done)}/{len(df)} runs stored, {wall:.0f} min of training"


def section(t: targets.Target, store_dir: Path) -> list[str]:
    paper_df, _, comp, _ = figures.compare(t, "paper", store_dir)
    quick_df = figures.runs(t, "quick", store_dir)
    status = _status(paper_df, comp, t.tolerance)
    if status == "not run" and quick_df.status.isin(store.FINISHED).any():
        status = "quick profile only"
    out = [f"## {t.id}: {t.title}", "", f"- status: **{status}**; tolerance ±{t.tolerance:g} pt ({t.why})"]
    compared = comp.dropna(subset=["ours", "paper"])
    if len(compared):
        lead = compared[compared.what.str.contains(t.headline, regex=False)] if t.headline else compared
        first = (lead if len(lead) else compared).iloc[0]
        worst = compared.loc[compared["diff"].abs().idxmax()]
        out.append(f"- ours vs paper: {first.what}: {fmt(first.ours)} vs {fmt(first.paper)}; largest |diff| "
                   f"over {len(compared)} numbers: {fmt(abs(worst['diff']))} ({worst.what})")
    diverged = {p: int((d.status == "diverged").sum()) for p, d in (("paper", paper_df), ("quick", quick_df))}
    if any(diverged.values()):
        out.append(f"- diverged runs: {diverged['paper']} (paper profile), {diverged['quick']} (quick profile)")
    beyond = status.startswith("partial") and (compared["diff"].abs() > t.tolerance).any()
    if status == "deviates" or beyond or any(diverged.values()):
        out.append(f"- cause: {t.cause or 'not found yet'}")
    out.append(f"- paper profile: `make {t.slug}` ({_runs(paper_df)})")
    out.append(f"- quick profile: `make {t.slug} profile=quick` ({_runs(quick_df)})")
    drawn = [f"`docs/reproduction/{p}/{t.slug}.*`" for p, d in (("paper", paper_df), ("quick", quick_df))
             if d.status.isin(store.FINISHED).any()]
    if drawn:
        out.append(f"- figure/table: {', '.join(drawn)}")
    return [*out, ""]


def write(store_dir: Path, path: Path | None = None) -> Path:
    path = path or store.ROOT / "REPRODUCTION.md"
    lines = [HEADER]
    for t in targets.TARGETS.values():
        lines += section(t, store_dir)
    lines += ["## IDs with nothing to run", ""]
    lines += [f"- {k}: {v}" for k, v in targets.NO_RUNS.items()] + [""]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)
    return path

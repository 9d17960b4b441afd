"""``REPRODUCTION.md``: for every figure and table, where the reproduction stands, from stored runs."""

from __future__ import annotations

import math
from pathlib import Path

from normfl.reproduce import figures, store, targets

HEADER = """# Reproduction status

Written by `make report` from the runs stored in `outputs/store` (not in git); the figures and
tables are in `docs/reproduction/<profile>/`, written by `make <id>` or `make figures`. Every number
is measured here (2 CPU cores, no GPU) by the command shown. Profiles:

- **paper**: the papers' settings (spec `../shared/spec`); test accuracy is evaluated every 10 rounds
  (NORMEC, FEDNORMEC) or 5 rounds (ALI-DPFL) and at the last round, instead of every round (the
  spec's resolution), to save time; tables reading the final round are unaffected, "highest
  accuracy" cells are maxima over the evaluated rounds.
- **quick**: a scaled version for this CPU (fewer rounds, grid points and seeds; a test subset),
  defined in each experiment file's `quick:` block. Its numbers are not comparable to the paper's.

Data: CIFAR-10 results come from the JPEG copy in `../shared/data` (labelled so in every run's
summary); Fashion-MNIST is exact. Status: **reproduced** (every compared number within the
tolerance), **deviates** (cause given), **partial** (some runs of the grid missing), **quick profile
only**, **not run**.
"""


def _status(df, comp, tol) -> str:
    if df.empty or not df.status.isin(store.FINISHED).any():
        return "not run"
    if not df.status.isin(store.FINISHED).all():
        return f"partial ({df.status.isin(store.FINISHED).sum()}/{len(df)} runs)"
    diffs = comp.dropna(subset=["ours", "paper"])["diff"].abs()
    if diffs.empty:
        return "drawn (the paper prints no numbers for it)"
    return "reproduced" if (diffs <= tol).all() else "deviates"


def _fmt(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def section(t: targets.Target, store_dir: Path) -> list[str]:
    out = [f"## {t.id}: {t.title}", ""]
    for profile in store.PROFILES:
        df, _, comp, _ = figures.compare(t, profile, store_dir)
        st = _status(df, comp, t.tolerance)
        done = df[df.status.isin(store.FINISHED)]
        wall = done["wall"].sum() if "wall" in done else 0.0
        line = f"- **{profile}**: {st}; `make {t.slug} profile={profile}` ({len(df)} runs"
        line += f", {wall / 60:.0f} min of training stored)" if len(done) else ")"
        out.append(line)
        compared = comp.dropna(subset=["ours", "paper"])
        if len(compared):
            first = compared.iloc[0]
            worst = compared.loc[compared["diff"].abs().idxmax()]
            out.append(f"  - {first.what}: ours {_fmt(first.ours)}, paper {_fmt(first.paper)}; "
                       f"largest |diff| over {len(compared)} numbers: {_fmt(abs(worst['diff']))} ({worst.what})")
        if profile == "paper" and st == "deviates" and t.cause:
            out.append(f"  - cause: {t.cause}")
        if st != "not run":
            out.append(f"  - table/figure: `docs/reproduction/{profile}/{t.slug}.*`")
    out += [f"- tolerance: ±{t.tolerance:g} points ({t.why})", ""]
    return out


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

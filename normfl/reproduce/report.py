"""``REPRODUCTION.md``: for every figure and table, where the reproduction stands, from stored runs."""

from __future__ import annotations

import re
from pathlib import Path

from normfl.render import fmt
from normfl.reproduce import figures, jobs, store, targets

HEADER = """# Reproduction status

Written by `make report` from the committed run records (`outputs/records`) and, for a run without
one, the working store (`outputs/store`, not in git); the figures and tables are in
`docs/reproduction/<profile>/`, written by `make <id>` or `make figures`. Every number
is measured here (2 CPU cores, no GPU) by the command shown. Profiles:

- **paper**: the papers' settings, read as `docs/readings.md` says where they leave a choice. NORMEC
  and FEDNORMEC read a round as one pass over each client's shard in minibatches (reading A2; 140 steps
  a pass with 10 clients, 70 with 20), evaluated after every pass: a GPU job (about 42,000 steps a run).
  ALI-DPFL is evaluated every 5 rounds and at the last, instead of every round (reading C-A14), to save
  time; tables reading the final round are unaffected, "highest accuracy" cells are maxima over the
  evaluated rounds.
- **text** (NORMEC and FEDNORMEC only): the text's literal reading of a round, one minibatch step
  per client, 300 steps, evaluated every 10 rounds. The runs made here before the paper profile
  took the pass reading are this profile's.
- **code** (ALI-DPFL's Fashion-MNIST cells only): the authors' public code as it runs
  (`experiment=alidpfl_authors_code`): their split, divisor, τ rule and evaluation, each a named option.
- **quick**: a scaled version for this CPU (fewer rounds, grid points and seeds; a test subset),
  set by the grids' `quick:` lists and the run groups' profiles (`normfl/reproduce/grids/`,
  `groups.yaml`). Its numbers are not compared with the paper's.

Data: CIFAR-10 results come from the offline JPEG copy (docs/configuration.md, "Data"; labelled so in every run's
summary); Fashion-MNIST is exact. Status, from the paper profile's runs: **reproduced** (every
compared number within the tolerance), **deviates** (cause given), **partial** (some runs of the grid
not trained yet; the comparison covers the stored ones), **drawn** (the paper prints no number for
it), **text / code / quick profile only**, **not run**. Wall times are the sum over a grid's stored runs.
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


def _versus(t: targets.Target, comp) -> str | None:
    """The headline comparison and the largest difference, or None when nothing is compared."""
    compared = comp.dropna(subset=["ours", "paper"])
    if not len(compared):
        return None
    lead = compared[compared.what.str.contains(t.headline, regex=False)] if t.headline else compared
    first = (lead if len(lead) else compared).iloc[0]
    worst = compared.loc[compared["diff"].abs().idxmax()]
    return (f"{first.what}: {fmt(first.ours)} vs {fmt(first.paper)}; largest |diff| over {len(compared)} "
            f"numbers: {fmt(abs(worst['diff']))} ({worst.what})")


def section(t: targets.Target, store_dir: Path) -> list[str]:
    paper_df, _, comp, _ = figures.compare(t, "paper", store_dir, figure=False)
    extra = {p: figures.compare(t, p, store_dir, figure=False)
             for p in jobs.OPTIONAL_PROFILES if jobs.has_profile(t.grid, p)}
    quick_df = figures.runs(t, "quick", store_dir)
    frames = {"paper": paper_df, **{p: c[0] for p, c in extra.items()}, "quick": quick_df}
    status = _status(paper_df, comp, t.tolerance)
    if status == "not run":
        status = next((f"{p} profile only" for p, d in frames.items() if d.status.isin(store.FINISHED).any()),
                      status)
    out = [f"## {t.id}: {t.title}", "", f"- status: **{status}**; tolerance ±{t.tolerance:g} pt ({t.why})"]
    if versus := _versus(t, comp):
        out.append(f"- ours vs paper: {versus}")
    deviating = status == "deviates" or _beyond(status, comp, t.tolerance)
    for p, (df, _, p_comp, _) in extra.items():
        p_status = _status(df, p_comp, t.tolerance)
        deviating |= p_status == "deviates" or _beyond(p_status, p_comp, t.tolerance)
        versus = _versus(t, p_comp)
        if p_status != "not run":
            out.append(f"- {p} profile ({jobs.OPTIONAL_PROFILES[p]}): **{p_status}**"
                       + (f"; ours vs paper: {versus}" if versus else ""))
    side = [line for p, (_, _, p_comp, _) in extra.items() for line in side_by_side(comp, p_comp, p)]
    diverged = {p: int((d.status == "diverged").sum()) for p, d in frames.items()}
    if any(diverged.values()):
        out.append("- diverged runs: " + ", ".join(f"{n} ({p} profile)" for p, n in diverged.items()))
    if deviating or any(diverged.values()):
        out.append(f"- cause: {_cause(t.cause)}")
    for p, d in frames.items():
        out.append(f"- {p} profile: `make {t.slug}{'' if p == 'paper' else f' profile={p}'}` ({_runs(d)})")
    drawn = [f"`docs/reproduction/{p}/{t.slug}.*`" for p, d in frames.items() if d.status.isin(store.FINISHED).any()]
    if drawn:
        out.append(f"- figure/table: {', '.join(drawn)}")
    return [*out, "", *side]


def side_by_side(comp, p_comp, profile: str) -> list[str]:
    """The numbers an optional profile has compared with the paper's, beside the paper profile's own."""
    ours = comp.set_index("what").ours.to_dict() if len(comp) else {}
    rows = p_comp.dropna(subset=["ours"])
    if rows.empty:
        return []
    lines = [f"| {profile} profile's cells | paper | ours, paper profile | ours, {profile} profile |",
             "|---|---|---|---|"]
    lines += [f"| {r.what} | {fmt(r.paper)} | {fmt(ours.get(r.what))} | {fmt(r.ours)} |" for r in rows.itertuples()]
    return [*lines, ""]


def _cause(title: str) -> str:
    """A link to the section of the deviations page that gives the cause (GitHub's heading anchor)."""
    if not title:
        return "not found yet"
    anchor = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
    return f"[{title}]({targets.DEVIATIONS}#{anchor})"


def _beyond(status: str, comp, tol: float) -> bool:
    """A partial grid whose stored runs already differ from the paper by more than the tolerance."""
    return status.startswith("partial") and bool((comp.dropna(subset=["ours", "paper"])["diff"].abs() > tol).any())


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

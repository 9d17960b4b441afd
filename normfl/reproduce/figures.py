"""Draw a figure or table from stored runs, in the paper's layout, beside the paper's numbers.

Each ID gets ``docs/reproduction/<profile>/<id>.{png,pdf}`` (figures) and/or ``.md`` / ``.csv``
(tables and the cells of heatmaps). Every table has the columns ours | paper | diff where the paper
prints a number, and a caption line with the data source and the profile. ``compare`` returns the
same comparison rows for the report. Cells, a run's curve and the writing of a figure are ``normfl.render``'s,
which ``normfl.collect`` shares.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from matplotlib.ticker import MaxNLocator
from omegaconf import OmegaConf

from normfl.render import curve, fmt, markdown_table, plt, round_axis, save
from normfl.reproduce import jobs, records, store
from normfl.reproduce.paper import paper_numbers, paper_value

OUT = store.ROOT / "docs" / "reproduction"
DATASETS = {"load_cifar10": "cifar10", "load_fashion_mnist": "fashion_mnist"}


# ---------------------------------------------------------------- the runs of an ID, as a table
def runs(target, profile: str, store_dir: Path) -> pd.DataFrame:
    """One row per run of the ID's grid: its settings, status and summary numbers (in %)."""
    rows = []
    for job in jobs.jobs(target.grid, profile):
        cfg, d = job.cfg, records.locate(job.key, store_dir)
        sel = lambda key, cfg=cfg: OmegaConf.select(cfg, key, default=None)  # noqa: E731
        row = {"key": job.key, "dir": d, "status": store.status(d), "command": job.command(),
               "method": job.method, "dataset": DATASETS.get(cfg.dataset._target_.rsplit(".", 1)[1]),
               "alpha": sel("algo.alpha"), "beta": sel("algo.beta"), "gamma": sel("algo.gamma"),
               "p": cfg.p, "seed": cfg.seed, "epsilon": cfg.privacy.epsilon, "rounds": cfg.rounds,
               "tau": sel("algo.tau"), "reading": sel("reading") or "text"}
        if row["status"] in store.FINISHED:
            s = json.loads((d / "summary.json").read_text())
            pct = lambda v: None if v is None else 100 * v  # noqa: E731
            row.update(final_acc=pct(s.get("final_test_acc")), best_acc=pct(s.get("best_test_acc")),
                       last5_err=None if s.get("last5_mean_test_acc") is None else 100 - pct(s["last5_mean_test_acc"]),
                       final_loss=s.get("final_train_loss"), bits=s.get("bits_per_coord"), data=s.get("data"),
                       wall=s.get("wall_time_s"), final_round=s.get("final_round"),
                       min_loss=curve(d).train_loss.min())
            if row["status"] == "diverged":       # no result for any table, argmax or mean; drawn up to its end
                row.update(final_acc=None, best_acc=None, last5_err=None, final_loss=None, min_loss=None)
        rows.append(row)
    return pd.DataFrame(rows)


def caption(df: pd.DataFrame, profile: str) -> str:
    done = df[df.status.isin(store.FINISHED)]
    parts = [f"profile **{profile}**", f"{len(done)} of {len(df)} runs stored"]
    if (df.status == "diverged").any():
        parts.append(f"{(df.status == 'diverged').sum()} diverged")
    parts.append("data: " + (", ".join(sorted(set(done["data"].dropna()))) if "data" in done else "none yet"))
    if profile == "quick":
        parts.append("a scaled run: its numbers are not comparable with the paper's")
    if profile in jobs.OPTIONAL_PROFILES:
        parts.append(jobs.OPTIONAL_PROFILES[profile])
    return "; ".join(parts)


# ---------------------------------------------------------------- selection rules (reading A8, docs/readings.md)
def tuned(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """For each group of ``by``, the run with the best final test accuracy (the papers' "tuned γ";
    diverged runs have none and are never chosen)."""
    ok = df.dropna(subset=["final_acc"])
    if ok.empty:
        return ok
    return ok.loc[ok.groupby(by, dropna=False)["final_acc"].idxmax().values].sort_values(by)


# ---------------------------------------------------------------- writers
def _paper(target_id: str) -> pd.DataFrame:
    p = paper_numbers()
    return p[p.id == target_id]


def _write_table(csv: pd.DataFrame, md: pd.DataFrame, path: Path, title: str, note: str) -> list[Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    csv.to_csv(path.with_suffix(".csv"), index=False)
    body = markdown_table(md) if len(md.columns) else "No run finished without diverging."
    md = [f"# {title}", "", note, "", body, ""]
    path.with_suffix(".md").write_text("\n".join(md))
    return [path.with_suffix(".md"), path.with_suffix(".csv")]


def _comparison(rows: list[tuple[str, float | None, float | None]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["what", "ours", "paper"])
    df["diff"] = df.ours - df.paper
    return df


# ---------------------------------------------------------------- the kinds of figures and tables
def best_table(target, df, profile):
    """NORMEC-T2 / F8 / F11: per method and β, the γ with the best final accuracy, and that accuracy."""
    paper = _paper(target.id)
    order = {m: i for i, m in enumerate(dict.fromkeys(paper.block))}       # the paper's row order
    best = tuned(df, ["method", "beta"])
    best = best.sort_values(["method", "beta"], key=lambda c: c.map(order).fillna(99) if c.name == "method" else c)
    rows = []
    for r in best.itertuples():
        def pv(column, r=r):
            return paper_value(target.id, block=r.method, row=f"beta={float(r.beta)!r}", column=column, default=None)
        acc = pv("final_accuracy")
        rows.append({"method": r.method, "beta": r.beta, "gamma (ours)": r.gamma, "gamma (paper)": pv("gamma"),
                     "final acc % (ours)": r.final_acc, "paper": acc,
                     "diff": None if acc is None else r.final_acc - acc})
    table = pd.DataFrame(rows)
    comp = _comparison([(f"{r['method']} β={r['beta']} final acc", r["final acc % (ours)"], r["paper"]) for r in rows])
    return table, comp, None


def heatmap(target, df, profile):
    """Highest test accuracy over a 2-D grid (rows ``target.draw['rows']``, columns ``['cols']``),
    one panel per method, max over every other swept value (γ for NORMEC-F2)."""
    rows_key, cols_key = target.draw.get("rows", "beta"), target.draw.get("cols", "gamma")
    methods = [m for m in target.draw.get("methods", sorted(df.method.unique())) if m in set(df.method)]
    panels = target.draw.get("panels") or [(m, m, "best_acc", "max") for m in methods]  # (title, method, value, agg)
    grids = {title: df[df.method == m].pivot_table(index=rows_key, columns=cols_key, values=v, aggfunc=agg)
             for title, m, v, agg in panels if m in set(df.method)}
    if target.draw.get("difference") and len(grids) == 2:
        a, b = grids
        grids[f"{a} − {b}"] = grids[a] - grids[b]
    fig, axes = plt.subplots(1, len(grids), figsize=(4.2 * len(grids), 3.6), squeeze=False)
    for ax, (name, g) in zip(axes[0], grids.items(), strict=True):
        im = ax.imshow(g.values, cmap="viridis" if "−" not in name else "coolwarm", aspect="auto")
        ax.set_xticks(range(len(g.columns)), [f"{c:g}" for c in g.columns])
        ax.set_yticks(range(len(g.index)), [f"{i:g}" for i in g.index])
        ax.set_xlabel(cols_key), ax.set_ylabel(rows_key), ax.set_title(name, fontsize=9)
        for (i, j), v in pd.DataFrame(g.values).stack().items():
            ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=7, color="w")
        fig.colorbar(im, ax=ax, fraction=0.046)
    cells, comp = [], []
    for name, g in grids.items():
        for r in g.index:
            for c in g.columns:
                pv = paper_value(target.id, row=f"{rows_key}={float(r)!r}", column=f"{cols_key}={float(c)!r}",
                                 metric="highest_test_accuracy_pct", default=None)
                cells.append({"panel": name, rows_key: r, cols_key: c, "ours": g.loc[r, c], "paper": pv,
                              "diff": None if pv is None else g.loc[r, c] - pv})
                if pv is not None:
                    comp.append((f"{name} {rows_key}={r:g} {cols_key}={c:g}", g.loc[r, c], pv))
    for m in (m for m in methods if m in grids):     # the peaks the text states (NORMEC-F4: 77.56 / 72.21)
        peak = paper_value(target.id, block={"normec_sn": "with_sn", "normec_no_sn": "no_sn"}.get(m, m),
                           row=f"{rows_key}=all", metric="highest_test_accuracy_pct", default=None)
        if peak is not None:
            comp.insert(0, (f"{m} peak", grids[m].values.max(), peak))
    return pd.DataFrame(cells), _comparison(comp), fig


def curves(target, df, profile):
    """Training loss and test accuracy against rounds: one line per (method, β[, α, p]) with γ tuned
    by final accuracy; colour = β, line style = the other key (``draw['style']``)."""
    style_key = target.draw.get("style", "method")
    by = [k for k in ("method", "beta", "alpha", "p")
          if k == style_key or k in target.draw.get("by", ("method", "beta"))]
    best = tuned(df, by)
    betas = sorted(best.beta.unique())
    colors = target.draw.get("colors") or {b: f"C{i}" for i, b in enumerate(betas)}   # matplotlib's cycle
    values = sorted(best[style_key].unique(), key=str)
    styles = target.draw.get("styles") or {v: ("-", "--", ":", "-.")[i % 4] for i, v in enumerate(values)}
    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(10, 4))
    for r in best.itertuples():
        m = curve(r.dir)
        style = getattr(r, style_key)
        label = f"{style_key}={style}, β={r.beta:g}, γ={r.gamma:g}"
        kw = dict(color=colors.get(r.beta, "k"), ls=styles.get(style, "-."), label=label, lw=1.2)
        loss = m.dropna(subset=["train_loss"])
        ax_l.plot(loss["round"], loss.train_loss, **kw)
        acc = m.dropna(subset=["test_acc"])
        ax_a.plot(acc["round"], 100 * acc.test_acc, **kw)
    x_label = x_axis(best)
    ax_l.set_yscale("log"), ax_l.set_xlabel(x_label), ax_l.set_ylabel("training loss")
    ax_a.set_xlabel(x_label), ax_a.set_ylabel("test accuracy (%)")
    ax_a.legend(fontsize=6, ncol=2)
    table = best[[*by, "gamma", "final_acc", "best_acc", "final_loss"]].rename(
        columns={"gamma": "tuned gamma", "final_acc": "final acc %", "best_acc": "best acc %"})
    return table, _comparison(_claims(target, best)), fig


def x_axis(df: pd.DataFrame) -> str:
    """What a curve's x-axis counts, by the runs' readings (``render.round_axis``)."""
    return round_axis(set(df.reading) if "reading" in df else {"text"})


def _claims(target, best) -> list:
    """Numbers the text states for curve figures (FEDNORMEC-F1's ~70% at p = 1, β = 0.01, ...)."""
    out = []
    for p in _paper(target.id).itertuples():
        if p.metric.startswith("test_accuracy_pct") and p.row.startswith("beta="):
            hit = best[(best.beta.astype(float) == float(p.row[5:])) & (best.p.astype(float) == float(p.block[2:]))]
            if len(hit):
                out.append((f"{p.block} {p.row} {p.metric}", hit.best_acc.iloc[0], p.value))
    return out


def mean_curve(dirs) -> pd.DataFrame:
    """The runs' metrics averaged round by round (the seeds of one column)."""
    return pd.concat([curve(d) for d in dirs]).groupby("round").mean(numeric_only=True)


def last5_spread(dirs) -> float:
    """The std (ddof 1) of the last five test errors of the runs' mean curve: the "±" of NFA App. G read as
    the spread over the last five rounds, which our records match in size where the std over seeds does
    not (reading C-N8). Its mean is the mean over seeds of the last-5 errors either way."""
    return (100 - 100 * mean_curve(dirs).test_acc.dropna()).tail(5).std()


def seeds_table(target, df, profile):
    """NFA Tables 2-6: per column, bits per coordinate and the last-5 test error, mean ± std over
    seeds and each seed's (the papers' std is a few hundredths; a reader needs to see which seed
    makes ours wider), the std over the last five rounds (``last5_spread``), beside the paper's; the
    figure draws the seed-mean curves of training loss and test error."""
    paper = _paper(target.id)
    g = df.dropna(subset=["last5_err"]).groupby(["dataset", "method"], sort=False)
    rows, comp = [], []
    for (ds, m), runs_ in g:
        runs_ = runs_.sort_values("seed")
        def pv(column, field="value", ds=ds, m=m):
            return paper_value(target.id, dataset=ds, row=m, column=column, field=field, default=None)
        err, sd = runs_.last5_err.mean(), runs_.last5_err.std() if len(runs_) > 1 else float("nan")
        paper_err = pv("test_error_last5")
        rows.append({"dataset": ds, "column": m, "seeds": len(runs_), "t (ours)": runs_.bits.iloc[0],
                     "t (paper)": pv("t"), "last-5 test error % (ours)": err, "± seeds (ours)": sd,
                     "± last 5 rounds (ours)": last5_spread(runs_.dir),
                     "per seed (ours)": ", ".join(f"{e:.2f}" for e in runs_.last5_err),
                     "paper": paper_err, "± (paper)": pv("test_error_last5", "std"),
                     "diff": None if paper_err is None else err - paper_err})
        comp.append((f"{ds} {m} last-5 test error", err, paper_err))
    means = {(r["dataset"], r["column"]): r["last-5 test error % (ours)"] for r in rows}
    for p in paper[paper.metric == "test_error_reduction_pct"].itertuples():   # "QTDL is 3% better than ..."
        ours = means.get((p.dataset, p.column[3:]), math.nan) - means.get((p.dataset, p.row), math.nan)
        comp.append((f"{p.dataset} {p.row} {p.column}: test error reduction (points)", ours, p.value))
    bits = {"t (ours)": "Int64", "t (paper)": "Int64"}                  # integers, also beside a run not yet made
    table = pd.DataFrame(rows).astype(bits) if rows else pd.DataFrame(rows)
    done = df[df.status == "completed"]
    datasets = list(dict.fromkeys(done.dataset))
    if not target.draw.get("figure", True) or not datasets:      # nothing to draw when every run diverged
        return table, _comparison(comp), None
    fig, axes = plt.subplots(len(datasets), 2, figsize=(10, 3.6 * len(datasets)), squeeze=False)
    for row_axes, ds in zip(axes, datasets, strict=True):      # one row per dataset, as NFA Fig. 5 a-d
        for m, runs_ in done[done.dataset == ds].groupby("method", sort=False):
            mean = mean_curve(runs_.dir)
            full = mean.get("full_train_loss", pd.Series(dtype=float)).dropna()
            loss = full if len(full) else mean.train_loss.dropna()       # the whole training set when logged
            row_axes[0].plot(loss.index, loss, label=f"{m} ({len(runs_)} seeds)")
            err = 100 - 100 * mean.test_acc.dropna()
            row_axes[1].plot(err.index, err, label=f"{m} ({len(runs_)} seeds)")
        row_axes[0].set_yscale("log"), row_axes[0].set_ylabel(f"{ds}: training loss")
        row_axes[1].set_ylabel(f"{ds}: test error (%)"), row_axes[1].legend(fontsize=7)
        for ax in row_axes:
            ax.set_xlabel("communication round")
    return table, _comparison(comp), fig


def ali_table(target, df, profile):
    """ALI Tables II-IV in the paper's layout: a row per method (ALI-DPFL, τ = ...), a column per
    (dataset, block, ε), each cell "ours / paper"; the CSV has one row per run."""
    df = df.assign(block=[_ali_block(r.epsilon, r.rounds) for r in df.itertuples()])
    rows, comp = [], []
    for r in df.dropna(subset=["final_acc"]).itertuples():
        pv = paper_value(target.id, dataset=r.dataset, block=r.block, row=r.method,
                         column=f"epsilon={float(r.epsilon)!r}", default=None)
        rows.append({"dataset": r.dataset, "block": r.block, "epsilon": r.epsilon, "method": r.method,
                     "R_s": r.rounds, "final acc % (ours)": r.final_acc, "paper": pv,
                     "diff": None if pv is None else r.final_acc - pv})
        comp.append((f"{_ali_column(r.dataset, r.block, r.epsilon)} {r.method}", r.final_acc, pv))
    long = pd.DataFrame(rows)
    if long.empty:
        return long, _comparison(comp), None
    cell = [f"{fmt(o)} / {fmt(p)}" for o, p in zip(long["final acc % (ours)"], long.paper, strict=True)]
    wide = long.assign(cell=cell, col=[_ali_column(d, b, e) for d, b, e in
                                       zip(long.dataset, long.block, long.epsilon, strict=True)])
    order = ["ali_dpfl", *sorted((m for m in wide.method.unique() if m != "ali_dpfl"), key=lambda m: (len(m), m))]
    wide = wide.pivot_table(index="method", columns="col", values="cell", aggfunc="first").reindex(order).reset_index()
    return (long, wide.rename(columns={"method": "method (ours / paper, %)"})), _comparison(comp), None


def _ali_column(dataset: str, block: str, epsilon: float) -> str:
    return " ".join(filter(None, (dataset, block, f"ε={epsilon}")))       # Tables III and IV: no block


def _ali_block(epsilon: float, rounds: int) -> str:
    """Table II's blocks: R_s = R_c, or R_s above R_c (the paper's "R_s = 2R_c"); R_c as ALI Sec. VI-B
    states it for each ε. Tables III and IV have one block each (empty label)."""
    rc = _paper_rc(epsilon)
    if rc is None or rounds < rc:
        return ""
    return "R_s=R_c" if rounds == rc else "R_s=2R_c"


def acc_vs_tau(target, df, profile):
    """ALI Fig. 1: final accuracy against a fixed τ, a panel per dataset and a line per (ε, R_s)."""
    done = df.dropna(subset=["final_acc"])
    datasets = sorted(set(done.dataset)) or [""]
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4), squeeze=False)
    for ax, ds in zip(axes[0], datasets, strict=True):
        for i, ((eps, rs), g) in enumerate(done[done.dataset == ds].groupby(["epsilon", "rounds"])):
            look = i // 10 % 2                                         # past ten lines the colours come round again
            g = g.sort_values("tau")
            ax.plot(g.tau, g.final_acc, marker="os"[look], linestyle=("-", "--")[look], label=f"ε={eps} R_s={rs}")
        ax.set_title(ds, fontsize=9), ax.set_xlabel("τ (local iterations)"), ax.set_ylabel("final test accuracy (%)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=6, ncol=2)
    keys = ["dataset", "epsilon", "rounds", "tau"]
    table = done[[*keys, "final_acc"]].sort_values(keys)
    return table, _comparison([]), fig


def tau_lists(target, df, profile):
    """ALI Fig. 6: the τ ALI-DPFL chose in each round, a panel per (dataset, R_s/R_c) and a line per ε."""
    done = df[df.status == "completed"]
    done = done.assign(ratio=[_ali_ratio(r.epsilon, r.rounds) for r in done.itertuples()])
    panels = sorted(set(zip(done.dataset, done.ratio, strict=True)))
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.5 * max(1, len(panels)), 3.6), squeeze=False)
    rows = []
    for r in done.itertuples():
        m = curve(r.dir).dropna(subset=["tau"])
        ax = axes[0, panels.index((r.dataset, r.ratio))]
        ax.step(m["round"], m.tau, where="post", label=f"ε={r.epsilon} R_s={r.rounds}")
        rows.append({"dataset": r.dataset, "epsilon": r.epsilon, "R_s": r.rounds,
                     "tau list": " ".join(str(int(t)) for t in m.tau), "steps": int(m.steps_total.iloc[-1])})
    for ax, (dataset, ratio) in zip(axes[0], panels, strict=False):
        ax.set_title(f"{dataset}, {ratio}", fontsize=9), ax.legend(fontsize=7)
        ax.set_xlabel("communication round"), ax.set_ylabel("τ*"), ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return pd.DataFrame(rows), _comparison([]), fig


def _ali_ratio(epsilon: float, rounds: int) -> str:
    """Condition II's ratio of R_s to the paper's R_c for ε: "R_s = R_c/2" or "R_s = R_c/5"."""
    rc = _paper_rc(epsilon)
    return f"R_s = R_c/{round(rc / rounds)}" if rc else f"R_s = {rounds}"


def _paper_rc(epsilon: float) -> float | None:
    """The R_c (DP-SGD steps) that ALI Sec. VI-B states ε supports; None for an ε it does not name."""
    return paper_value("ALIDPFL-TEXT6B", column=f"epsilon={float(epsilon)!r}", default=None)


def transmissions(target, df, profile):
    """FEDNORMEC-F2 / F5(b): test accuracy and training loss against total client-to-server
    transmissions, per p at β = 0.01 with γ tuned per p; transmissions to reach 65%."""
    sel = df[df.beta.astype(float) == 0.01]
    best = tuned(sel, ["p"])
    fig, (ax_a, ax_l) = plt.subplots(1, 2, figsize=(10, 4))
    comp, rows = [], []
    for r in best.itertuples():
        m = curve(r.dir)
        acc = m.dropna(subset=["test_acc"])
        ax_a.plot(acc.transmissions_total, 100 * acc.test_acc, marker=".", label=f"p={r.p} (γ={r.gamma:g})")
        ax_l.plot(m.transmissions_total, m.train_loss, label=f"p={r.p}")
        reach = acc[100 * acc.test_acc >= 65.0]
        ours = float(reach.transmissions_total.iloc[0]) if len(reach) else None
        pv = paper_value(target.id, row=f"p={float(r.p)!r}", default=None)
        rows.append({"p": r.p, "tuned gamma": r.gamma, "best acc %": r.best_acc,
                     "transmissions to 65% (ours)": ours, "paper": pv})
        if pv is not None:
            comp.append((f"p={r.p} transmissions to 65%", ours, pv))
    ax_a.set_xlabel("total client-to-server transmissions"), ax_a.set_ylabel("test accuracy (%)")
    ax_l.set_xlabel("total client-to-server transmissions"), ax_l.set_ylabel("training loss"), ax_l.set_yscale("log")
    ax_a.legend(fontsize=7)
    return pd.DataFrame(rows), _comparison(comp), fig


KINDS = {"best_table": best_table, "heatmap": heatmap, "curves": curves, "seeds_table": seeds_table,
         "ali_table": ali_table, "acc_vs_tau": acc_vs_tau, "tau_lists": tau_lists, "transmissions": transmissions}


def compare(target, profile: str, store_dir: Path, figure: bool = True):
    """(runs, table, comparison, figure) of an ID from what is stored; without ``figure`` the figure is
    closed and None (a caller that only reads numbers leaves no figure open)."""
    df = runs(target, profile, store_dir)
    done = df[df.status.isin(store.FINISHED)]
    if done.empty:
        return df, None, _comparison([]), None
    table, comp, fig = KINDS[target.kind](target, done, profile)
    if fig is not None and not figure:
        plt.close(fig)
        fig = None
    return df, table, comp, fig


def draw(target, profile: str, store_dir: Path, out: Path = OUT, images: bool = True) -> list[Path]:
    """Write the ID's table (.md, .csv) and, with ``images``, its figure (.png, .pdf) into ``out/<profile>/``;
    nothing when no run is stored. What an earlier draw left there goes first, so the folder holds what the
    runs give and nothing else."""
    base = Path(out) / profile / target.slug
    for old in base.parent.glob(f"{target.slug}.*"):       # no stale table or figure
        old.unlink()
    df, table, comp, fig = compare(target, profile, store_dir)
    if table is None:
        return []
    title = f"{target.id}: {target.title}"
    note = caption(df, profile)
    csv, md = table if isinstance(table, tuple) else (table, table)   # a kind may lay out the .md differently
    written = _write_table(csv, md, base, title, note)
    if fig is not None and images:
        written += save(fig, base, title, note)
    elif fig is not None:
        plt.close(fig)
    return written

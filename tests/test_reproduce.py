"""The reproduction driver: grids, store keys, running only what is missing, drawing and the report."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from normfl.config import compose, config_key, validate
from normfl.errors import ConfigError
from normfl.reproduce import figures, jobs, records, report, store, targets
from tests.helpers import REPO, script

TINY = ["dataset=fashion_mnist", "model=logreg", "clients=3", "rounds=2", "eval_every=1",
        "dataset.train_limit=600", "dataset.test_limit=200"]


def test_grid_is_the_union_of_blocks_and_quick_replaces_lists():
    paper = jobs.grid_points("normec_f10", "paper")
    assert len(paper) == 32                                  # Clip21 4×4 + α-NormEC without SN 4×4
    assert {p["experiment"] for p in paper} == {"normec_np_clip21", "normec_np_nosn"}   # their own sweeps
    t2 = jobs.grid_points("normec_t2", "paper")
    assert len(t2) == 32 and {p.get("algo.alpha") for p in t2} == {0.01, None}   # NP-SN sliced to α = 0.01
    quick = jobs.grid_points("normec_f10", "quick")
    assert len(quick) == 16 and {p["algo.gamma"] for p in quick} == {0.01, 0.1}
    assert {p["algo.beta"] for p in quick} == {0.01, 0.1, 1.0, 10.0}     # untouched lists stay
    ali = jobs.grid_points("alidpfl_t2", "paper")
    assert len(ali) == 2 * 6 * (1 + 5)                       # datasets × budgets × (ALI + τ = 1..5)
    with pytest.raises(ConfigError, match="profile"):
        jobs.grid_points("normec_f10", "fast")
    with pytest.raises(ConfigError, match="grid='no_such_figure'; allowed: alidpfl_f1"):
        jobs.grid_points("no_such_figure", "paper")


def test_store_key_ignores_how_a_run_runs_and_is_shared_between_figures():
    def nosn(name):      # α-NormEC without SN at β = γ = 0.1, as a grid of `name` runs it
        return next(j for j in jobs.jobs(name, "paper") if j.params["experiment"] == "normec_np_nosn"
                    and j.params["algo.beta"] == 0.1 and j.params["algo.gamma"] == 0.1)

    a, b = nosn("normec_t2"), nosn("normec_f3")
    assert a.key == b.key and a.key.startswith("normec-")     # one run feeds NORMEC-T2 and F3
    assert a.cfg.algo.server_norm is False and a.cfg.eval_every == 1      # the run group's paper settings
    cfg = a.cfg.copy()
    cfg.threads, cfg.backend, cfg.progress = 1, "vmap", False
    assert config_key(cfg) == a.key
    cfg.data_root, cfg.offline_data = "/scratch/torchvision", "/gpu-box/.gpu/data"   # where the data lives
    assert config_key(cfg) == a.key and cfg.dataset.root == "/scratch/torchvision"
    cfg.seed = 43
    assert config_key(cfg) != a.key
    keys = [j.key for j in jobs.jobs("normec_t2", "paper")]
    assert len(set(keys)) == len(keys) == 32
    assert {j.cfg.profile for j in jobs.jobs("normec_t2", "quick")} == {"quick"}


def test_paper_profile_reads_a_round_as_a_pass_and_text_keeps_the_literal_reading():
    """NORMEC/FEDNORMEC: paper = 300 passes evaluated every pass; text = the stored literal-reading runs,
    under keys of their own; IDs whose run groups define no text profile refuse it."""
    for name in ("normec_t2", "fednormec_f1"):
        paper, text = jobs.jobs(name, "paper"), jobs.jobs(name, "text")
        assert len(paper) == len(text)
        assert {(j.cfg.reading, j.cfg.eval_every, j.cfg.rounds) for j in paper} == {("pass", 1, 300)}
        assert {(j.cfg.reading, j.cfg.eval_every, j.cfg.rounds) for j in text} == {("text", 10, 300)}
        assert not {j.key for j in paper} & {j.key for j in text}
        for job in paper[:2]:
            validate(job.cfg)
    assert {j.cfg.reading for j in jobs.jobs("normec_t2", "quick")} == {"text"}
    assert jobs.has_profile("normec_t2", "text") and not jobs.has_profile("alidpfl_t2", "text")
    with pytest.raises(ConfigError, match=r"profile='text'; allowed: paper \| code \| quick for alidpfl_t2"):
        jobs.jobs("alidpfl_t2", "text")


def test_code_profile_runs_the_authors_code_on_the_fashion_mnist_cells():
    """ALI-DPFL's code profile: the paper grid's Fashion-MNIST points under experiment=alidpfl_authors_code,
    with keys of their own; IDs whose run groups define no code profile refuse it."""
    code, paper = jobs.jobs("alidpfl_f6", "code"), jobs.jobs("alidpfl_f6", "paper")
    fmnist = [j for j in paper if j.params["experiment"] == "alidpfl_fmnist"]
    assert [j.params["budget"] for j in code] == [j.params["budget"] for j in fmnist] and len(code) == 6
    assert {(j.cfg.dataset.split, j.cfg.algo.divisor, j.cfg.eval_subset, j.cfg.profile) for j in code} == {
        ("per_client", 64, 0.2, "code")}
    assert not {j.key for j in code} & {j.key for j in paper}
    validate(code[0].cfg)
    assert not jobs.has_profile("normec_t2", "code")
    with pytest.raises(ConfigError, match=r"profile='code'; allowed: paper \| quick for normfedavg_t6"):
        jobs.jobs("normfedavg_t6", "code")


def test_every_id_composes_under_both_profiles():
    for t in targets.TARGETS.values():
        for job in jobs.jobs(t.grid, "quick"):
            assert job.cfg.profile == "quick"
            assert job.method and "{" not in job.method          # every run has its paper name
        assert jobs.grid_points(t.grid, "paper")
    slugs = re.search(r"^IDS := (.*?)\n\S", (REPO / "Makefile").read_text(), re.S | re.M).group(1)
    assert slugs.replace("\\", " ").split() == [t.slug for t in targets.TARGETS.values()]


@pytest.mark.slow
def test_a_grids_configs_are_hydras_own():
    """``jobs.compose`` composes the config groups once and sets each run's values on a copy, with Hydra's
    own function: the same configs as Hydra composing every run whole (checked here on the first and last
    run of every ID's grid under every profile, and on overrides that add, delete, set null, a list and a
    dict; all 788 runs of the grids compared equal when it was written), and the same refusal of a key that
    does not exist."""
    from hydra.errors import ConfigCompositionException

    cases = {("algo=dpfl", "+extra=1", "~algo.tau", "eval_every=null", "dataset=cifar10", "algo.lr=0.25"),
             ("experiment=nfa_t4_qtdl", "algo.beta=[[0,0.2],[50,0.1]]", "algo={s: 64}", "rounds=3")}
    for t in targets.TARGETS.values():
        for profile in jobs.PROFILES:
            if jobs.has_profile(t.grid, profile):
                points = jobs.grid_points(t.grid, profile)
                cases |= {tuple(jobs.point_overrides(p, profile)) for p in (points[0], points[-1])}
    for overrides in cases:
        whole = compose.whole(overrides)                         # Hydra composing the run whole
        assert OmegaConf.to_yaml(jobs.compose(overrides)) == OmegaConf.to_yaml(whole), overrides
        assert OmegaConf.is_struct(jobs.compose(overrides))
    with pytest.raises(ConfigCompositionException, match="algo.no_such_key"):
        jobs.compose(("algo=dpfl", "algo.no_such_key=1"))


def test_runs_carry_no_figure_data_and_are_named_by_their_group():
    """What the figure driver reads (grids, profiles, the paper's names) stays out of every run's config,
    so the store key needs to leave none of it out; a run group names its runs, by one key where needed."""
    root = set(jobs.compose(()))
    for name in (p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")):
        assert set(jobs.compose((f"experiment={name}",))) <= root, name
    assert set(jobs.groups()) <= {p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")}
    assert jobs.method("normec_p150", {}) == "normec_no_sn"
    assert jobs.method("alidpfl_fmnist", {"algo": "dpfl", "algo.tau": 3}) == "tau=3"
    assert jobs.method("alidpfl_fmnist", {"algo": "ali_dpfl"}) == "ali_dpfl"
    assert jobs.method("nfa_t4_qtdl", {"algo.s": 64, "seed": 1}) == "qtdl_s=2^6"
    with pytest.raises(ConfigError, match="experiment='quick_fmnist'; allowed: a run group of"):
        jobs.method("quick_fmnist", {})


def test_run_missing_leaves_a_run_another_live_process_holds(tmp_path):
    """A store folder without a summary is cleared and run again, unless a live process holds it (two
    drivers at once): then it is left to that process, untouched."""
    import os
    import socket

    d = tmp_path / "k0"
    d.mkdir()
    (d / ".lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": "now"}))
    (d / "metrics.csv").write_text("round\n0\n")
    logs = []
    assert store.run_missing([jobs.Job({}, [*TINY], key="k0")], tmp_path, log=logs.append) == {}
    assert (d / "metrics.csv").read_text() == "round\n0\n" and "held by another live process" in logs[0]


@pytest.mark.slow
def test_run_missing_trains_only_what_is_missing_and_records_failures(tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("NORMFL_DATA", str(data_root))
    good = [jobs.Job({}, [*TINY, f"seed={s}"], key=f"k{s}") for s in (0, 1)]
    bad = jobs.Job({}, [*TINY, "algo.gamma=-1"], key="bad")
    logs = []
    counts = store.run_missing([*good, bad], tmp_path, parallel=2, log=logs.append)
    assert counts == {"completed": 2, "failed": 1}
    assert json.loads((tmp_path / "bad" / "summary.json").read_text())["status"] == "failed"
    assert "algo.gamma" in (tmp_path / "bad" / "stdout.txt").read_text()       # the refusal is kept
    (tmp_path / "k1" / "summary.json").unlink()               # as if killed before it finished
    first = len(logs)
    counts = store.run_missing([*good, bad], tmp_path, log=logs.append)
    assert counts == {"completed": 1}                          # k0 reused, bad not retried, k1 re-run
    assert "2 already stored, 1 to run" in logs[first]
    assert "record refused" in logs[-1]                        # a folder named k1 is not its config's key


@pytest.mark.slow
def test_run_missing_stacks_runs_that_share_model_and_data(tmp_path, data_root, monkeypatch):
    """With ``stack``, runs that share model, data and seed train in one process; each lands in its own store
    folder with its config, and a refused one is recorded as failed with the reason."""
    monkeypatch.setenv("NORMFL_DATA", str(data_root))
    points = [["algo.beta=0.1"], ["algo.beta=1.0"], ["algo.gamma=-1"]]
    stack = [jobs.Job({}, [*TINY, *p], key=f"k{i}", cfg=jobs.compose((*TINY, *p))) for i, p in enumerate(points)]
    logs = []
    counts = store.run_missing(stack, tmp_path, stack=4, log=logs.append)
    assert counts == {"completed": 2, "failed": 1} and "up to 4 run(s) per process" in logs[0]
    for k in ("k0", "k1"):
        assert (tmp_path / k / ".hydra" / "config.yaml").is_file()
        assert len(pd.read_csv(tmp_path / k / "metrics.csv")) == 3
    assert "algo.gamma" in json.loads((tmp_path / "k2" / "summary.json").read_text())["error"]


def fake_run(d: Path, final_acc, losses, status="completed", **summary):
    d.mkdir(parents=True)
    rounds = range(len(losses) + 1)
    pd.DataFrame({"round": rounds, "train_loss": [None, *losses],
                  "test_acc": [0.1] * len(losses) + [final_acc]}).to_csv(d / "metrics.csv", index=False)
    (d / "summary.json").write_text(json.dumps({"status": status, "final_test_acc": final_acc, **summary}))
    return d


def test_a_diverged_run_gives_no_number_to_any_table(tmp_path, monkeypatch):
    """A diverged seed kept its last-five accuracy and train loss, which NFA's seed tables averaged in."""
    monkeypatch.setattr(records, "RECORDS", tmp_path / "no-records")
    target = targets.get("normfedavg-t6")
    key = jobs.jobs(target.grid, "paper")[0].key
    fake_run(tmp_path / "store" / key, 0.9, [1.0, 0.8], status="diverged", last5_mean_test_acc=0.9,
             final_train_loss=0.8, best_test_acc=0.9)
    row = figures.runs(target, "paper", tmp_path / "store").set_index("key").loc[key]
    assert row.status == "diverged"
    assert all(pd.isna(row[c]) for c in ("final_acc", "best_acc", "last5_err", "final_loss", "min_loss"))


def test_tuned_gamma_is_chosen_by_final_accuracy_and_skips_diverged():
    rows = [dict(method="m", beta=0.1, gamma=g, final_acc=a)
            for g, a in ((0.01, 60.0), (0.1, 70.0), (1.0, None))]  # γ = 1 diverged: no accuracy
    best = figures.tuned(pd.DataFrame(rows), ["method", "beta"])
    assert list(best.gamma) == [0.1]
    table, comp, fig = figures.best_table(targets.get("normec-t2"), pd.DataFrame(rows).assign(
        method="normec_no_sn"), "paper")
    assert table["final acc % (ours)"].tolist() == [70.0] and table["paper"].tolist() == [86.09]
    assert comp["diff"].iloc[0] == pytest.approx(70.0 - 86.09)


def test_table_cells_keep_small_settings_readable():
    # β = 0.001 printed as 0.00 made the grid's β = 0.001 and 0.01 rows indistinguishable
    assert [figures.fmt(v) for v in (0.001, 0.025, 0.1, 12.345, 0.0, -0.004, None, 20)] == [
        "0.001", "0.025", "0.10", "12.35", "0.00", "-0.004", "–", "20"]


def test_seed_table_averages_seeds_beside_the_paper(tmp_path):
    rows = [dict(dataset="fashion_mnist", method="normfedavg", status="completed", bits=32, seed=seed,
                 last5_err=e, dir=fake_run(tmp_path / str(seed), 1 - e / 100, [1.0, 0.8]))
            for seed, e in ((2, 11.4), (0, 11.0), (1, 11.2))]
    table, comp, fig = figures.seeds_table(targets.get("normfedavg-t6"), pd.DataFrame(rows), "paper")
    row = table.iloc[0]
    assert row["seeds"] == 3 and row["last-5 test error % (ours)"] == pytest.approx(11.2)
    assert row["± seeds (ours)"] == pytest.approx(0.2) and row["paper"] == 11.21
    # the seed-mean curve's test error, 90, 90, 11.2 % (rounds 0-2; fewer than five rounds here), and its std
    assert row["± last 5 rounds (ours)"] == pytest.approx(pd.Series([90.0, 90.0, 11.2]).std())
    assert row["per seed (ours)"] == "11.00, 11.20, 11.40"               # in the order of the seeds
    assert fig is None                                        # the table's figure is NORMFEDAVG-F5
    assert figures.seeds_table(targets.get("normfedavg-f5"), pd.DataFrame(rows), "paper")[2] is not None


def test_report_status_follows_the_tolerance():
    df = pd.DataFrame({"status": ["completed", "completed"]})
    comp = figures._comparison([("a", 80.0, 81.0), ("b", 70.0, None)])
    assert report._status(df, comp, 2.0) == "reproduced"
    assert report._status(df, comp, 0.5) == "deviates"
    assert report._status(df.assign(status=["completed", "missing"]), comp, 2.0) == "partial (1/2 runs)"
    assert report._status(df.assign(status="missing"), comp, 2.0) == "not run"
    assert report._status(df, figures._comparison([]), 2.0).startswith("drawn")


def test_report_sets_an_optional_profiles_cells_beside_the_paper_profiles():
    paper = figures._comparison([("τ=1", 58.77, 81.94), ("τ=5", 58.32, 79.64)])
    code = figures._comparison([("τ=1", 57.84, 81.94), ("τ=3", None, 81.26)])
    assert report.side_by_side(paper, code, "code") == [
        "| code profile's cells | paper | ours, paper profile | ours, code profile |", "|---|---|---|---|",
        "| τ=1 | 81.94 | 58.77 | 57.84 |", ""]
    assert report.side_by_side(paper, figures._comparison([]), "code") == []


def test_report_names_the_text_profile_where_it_exists(tmp_path):
    f2 = "\n".join(report.section(targets.get("fednormec-f2"), tmp_path))
    assert "- status: **not run**" in f2
    assert "`make fednormec-f2 profile=text` (0/9 runs stored" in f2 and "`make fednormec-f2` (0/9" in f2
    assert "profile=text" not in "\n".join(report.section(targets.get("normfedavg-t6"), tmp_path))
    assert figures.x_axis(pd.DataFrame({"reading": ["pass", "pass"]})) == "pass over each client's shard"
    assert figures.x_axis(pd.DataFrame({"reading": ["text"]})) == "communication round"


def test_every_kind_draws_from_stored_runs(tmp_path, monkeypatch):
    """Each figure/table kind turns a frame of stored runs into a table (and a figure) without error."""
    rows = []
    grid = [("normec_sn", 0.01, 0.1, 1.0, 1), ("normec_no_sn", 0.01, 0.1, 0.25, 3),
            ("normec_sn", 0.1, 0.01, 1.0, 5), ("normec_no_sn", 0.1, 0.1, 0.25, 1)]
    for i, (meth, beta, gamma, p, tau) in enumerate(grid):
        d = fake_run(tmp_path / str(i), 0.5 + i / 10, [2.0, 1.0, 0.5])
        metrics = pd.read_csv(d / "metrics.csv").assign(tau=[None, tau, tau, tau], steps_total=[0, 1, 2, 3],
                                                        transmissions_total=[0, 20, 40, 60])
        metrics.to_csv(d / "metrics.csv", index=False)
        rows.append(dict(method=meth, seed=i, beta=beta, gamma=gamma, alpha=0.01, p=p, tau=tau, epsilon=2.0, rounds=3,
                         dataset="cifar10", status="completed", dir=d, final_acc=50.0 + 10 * i,
                         best_acc=55.0 + 10 * i, final_loss=0.5, min_loss=0.5, last5_err=30.0, bits=32,
                         data="CIFAR-10 (JPEG copy)"))
    df = pd.DataFrame(rows)
    monkeypatch.setattr(figures, "OUT", tmp_path / "out")
    for kind, fn in figures.KINDS.items():
        target = targets.Target("X-F1", "x", kind, kind, 1.0, "test", draw={"methods": ["normec_sn", "normec_no_sn"]})
        table, comp, fig = fn(target, df, "quick")
        assert len(table) and set(comp.columns) == {"what", "ours", "paper", "diff"}, kind
        if fig is not None:
            assert [p.suffix for p in figures.save(fig, tmp_path / "out" / kind, kind, "note")] == [".png", ".pdf"]


@pytest.mark.slow
def test_make_run_ends_with_the_papers_number_and_the_gpu_command(tmp_path, capsys, data_root):
    """scripts/main_job.py, what `make run` prints: the main job's accuracy against NORMEC Table 2's cell
    (α-NormEC with SN, β = γ = 0.1: 85.43%), and no comparison for a setting the paper does not print."""
    main_job = script("main_job")
    for name, overrides in (("main", ()), ("other", ("algo.beta=0.5",))):
        d = tmp_path / name
        (d / ".hydra").mkdir(parents=True)
        OmegaConf.save(jobs.compose(overrides), d / ".hydra" / "config.yaml")
        (d / "summary.json").write_text(json.dumps({"status": "completed", "final_test_acc": 0.5, "final_round": 300,
                                                    "data": "CIFAR-10 (JPEG copy)"}))
        main_job.report(d)
    out = capsys.readouterr().out.split("\n\n")
    assert "85.43%" in out[0] and "-35.43 points" in out[0] and "reading=pass" in out[0]
    assert "No paper number" in out[1]
    assert main_job.setting() == (main_job.GPU if torch.cuda.is_available() else main_job.CPU)
    assert "reading=pass" in main_job.GPU and "eval_every=1" in main_job.GPU      # 300 passes, each evaluated
    run_dir = tmp_path / "made"                          # `make run ARGS=...`: the machine's setting, then the ARGS
    assert main_job.main(run_dir, ["dataset=fashion_mnist", "model=logreg", "rounds=2", "dataset.train_limit=200",
                                   "dataset.test_limit=50", "progress=false", "threads=1", "device=cpu",
                                   f"data_root={data_root}"]) == 0
    out = capsys.readouterr().out
    assert "main job: " + " ".join(main_job.setting()) in out and "No paper number" in out
    assert json.loads((run_dir / "summary.json").read_text())["final_round"] == 2


def test_the_store_comes_from_the_environment_or_the_working_directory(tmp_path, monkeypatch):
    """Never from the checkout: --store, else $NORMFL_STORE, else outputs/store under the working directory."""
    from normfl.reproduce.__main__ import store_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NORMFL_STORE", "elsewhere")
    assert store_dir() == tmp_path / "elsewhere" and store_dir(Path("given")) == tmp_path / "given"
    monkeypatch.delenv("NORMFL_STORE")
    assert store_dir() == tmp_path / "outputs" / "store"
    assert not any(tmp_path.iterdir())                      # finding it makes nothing


def test_adopt_files_a_hand_made_run_under_the_profiles_key(tmp_path):
    """The adopted copy is the run of the config beside it: its summary's key and profile say so, the
    hand-made run's key is kept as adopted_key, and the hand-made run is left as it was."""
    from omegaconf import OmegaConf

    from normfl.config import config_key
    from normfl.reproduce.__main__ import adopt

    cfg = jobs.compose(("experiment=alidpfl_fmnist", "algo=dpfl", "budget=e175_r177"))
    run = tmp_path / "by_hand"
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    summary = {"status": "completed", "config_key": config_key(cfg), "profile": "custom"}
    (run / "summary.json").write_text(json.dumps(summary))
    adopt([str(run)], "code", tmp_path / "store")
    cfg.profile = "code"
    target = tmp_path / "store" / config_key(cfg)
    adopted = json.loads((target / "summary.json").read_text())
    assert adopted["config_key"] == target.name != summary["config_key"] == adopted["adopted_key"]
    assert adopted["profile"] == "code" and adopted["adopted_from"] == str(run)
    assert config_key(OmegaConf.load(target / ".hydra" / "config.yaml")) == target.name
    assert json.loads((run / "summary.json").read_text()) == summary


@pytest.mark.parametrize("argv, match", [
    (["campaign", "normfedavg-t3", "--parallel", "0"], r"--parallel=0; allowed: a whole number, at least 1"),
    (["run", "normfedavg-t3", "--stack", "-1"], r"--stack=-1; allowed: a whole number, at least 1"),
    (["campaign", "normfedavg-t3", "--threads", "0"], r"--threads=0; allowed"),
    (["campaign", "normfedavg-t3", "--match", "experiment=nfa_t3_clip2 "], r"--match=\['experiment=nfa_t3_clip2 '\]; "
     r"allowed: text in the train.py command of at least one run of NORMFEDAVG-T3"),
    (["campaign", "normfedavg-t3", "--budget", "5x"], r"--budget='5x'; allowed: a duration such as 90s"),
    (["run", "normfedavg-t3", "--launcher", "slurmm"], r"--launcher='slurmm'; allowed: .*joblib .*slurm"),
])
def test_the_drivers_bad_options_are_refused_before_any_work(argv, match, tmp_path):
    from normfl.reproduce.__main__ import main

    with pytest.raises(ConfigError, match=match):
        main([*argv, "--store", str(tmp_path / "store")])
    assert not (tmp_path / "store").exists()                # refused before anything was made


@pytest.mark.parametrize("argv, match", [
    (["together", "{tmp}/nosuch"], r"together=\['.*nosuch'\]; allowed: run folders holding .hydra/config.yaml"),
    (["together", "{tmp}", "--dry-run"], r"--dry-run=True; allowed: only with run or campaign \(not read by together"),
    (["together"], r"together=\[\]; allowed: one or more run folders"),
    (["adopt", "{tmp}/nosuch"], r"adopt=\['.*nosuch'\]; allowed: run folders that exist"),
    (["record", "NOSUCHID"], r"record=\['NOSUCHID'\]; allowed: no names"),
    (["list", "extra"], r"list=\['extra'\]; allowed: no names"),
    (["run", "normfedavg-t3", "--budget", "5m"], r"--budget='5m'; allowed: only with campaign \(not read by run"),
    (["run", "normfedavg-t3", "--checkpoints"], r"--checkpoints=True; allowed: only with campaign"),
    (["figures", "normfedavg-t3", "--dry-run"], r"--dry-run=True; allowed: only with run or campaign"),
    (["campaign", "normfedavg-t3", "--retry-failed"], r"--retry-failed=True; allowed: only with run"),
    (["campaign", "normfedavg-t3", "--budget", "0s", "--store", "{tmp}/store"], r"--budget='0s'; allowed: a "
     "duration above zero"),
    (["campaign", "normfedavg-t3", "--archive", "{tmp}/file"], r"--archive='.*file'; allowed: a path where no "
     "archive is yet"),
    (["campaign", "normfedavg-t3", "--archive", "{tmp}/c.tar.gz"], r"--archive='.*c.tar.gz'; allowed: a path where no "
     "archive is yet \\(.*c-2.tar.gz is there"),
    (["report", "--store", "{tmp}/nosuch"], r"--store='.*nosuch'; allowed: an existing run store directory"),
    (["run", "normfedavg-t3", "--dry-run", "--store", "{tmp}/file"], r"--store='.*file'; allowed: an existing run "
     "store directory"),
])
def test_an_option_or_name_a_command_does_not_read_is_refused(argv, match, tmp_path):
    """Each command refuses what it would ignore (``together --dry-run`` trained), and run folders or stores
    that are not there, before any work."""
    from normfl.reproduce.__main__ import main

    (tmp_path / "file").write_text("")
    (tmp_path / "c-2.tar.gz").write_text("")                 # a part of an earlier archive
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ConfigError, match=match):
        main([a.format(tmp=tmp_path) for a in argv])
    assert sorted(tmp_path.rglob("*")) == before


def test_adopting_an_archive_that_is_not_there_is_refused(tmp_path):
    from normfl.reproduce.__main__ import main

    with pytest.raises(ConfigError, match=r"adopt=\['.*no.tar.gz'\]; allowed: archives that exist"):
        main(["adopt", str(tmp_path / "no.tar.gz"), "--store", str(tmp_path / "store")])

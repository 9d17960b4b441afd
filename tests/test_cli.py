"""``train.py`` as a new user meets it: the default path does not crash on a round nobody takes part in,
a certificate asked for half-way is refused and a run certifying more than its target (or nothing) says so, sweeps of
many overrides run in numbered folders with a table of jobs, every run and sweep ends with its outcome,
and Ctrl-C saves a checkpoint and prints a command that continues the run, exactly as printed."""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from normfl.collect import collect
from normfl.ops import bernoulli_weights
from normfl.run import run
from tests.helpers import CONF, OFFLINE, REPO, train, train_command

SMALL = ["dataset=fashion_mnist", "dataset.train_limit=1000", "dataset.test_limit=200", "model=logreg",
         "progress=false", "device=cpu", "threads=1"]


def first_empty_round(n: int, p: float, seed: int) -> int:
    return next(k for k in range(1000) if not bool((bernoulli_weights(n, p, seed, k) > 0).any()))


@pytest.mark.slow
def test_dp_fedavg_with_rounds_nobody_takes_part_in_runs_on_every_backend(tmp_path, data_root):
    """Issue 27.1: at p = 0.25 over 10 clients a round has no participant 5.6% of the time; backend=stacked
    (which auto picks) crashed on it. Every backend now finishes, all with the same numbers."""
    empty = first_empty_round(10, 0.25, 42)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        base = [*SMALL, f"data_root={data_root}", "algo=dp_fedavg", "p=0.25", f"rounds={empty + 1}",
                "algo.beta=0.1", "algo.gamma=1.0", "eval_every=1000"]
        metrics = {}
        for backend in ("sequential", "vmap", "analytic", "stacked", "auto"):
            summary = run(compose(config_name="config", overrides=[*base, f"backend={backend}"]), tmp_path / backend)
            assert summary["status"] == "completed", backend
            metrics[backend] = pd.read_csv(tmp_path / backend / "metrics.csv")
    row = metrics["stacked"].iloc[empty + 1]                            # round empty + 1 ran round k = empty
    assert row["transmissions"] == 0 and np.isnan(row["train_loss"])
    for backend, m in metrics.items():
        pd.testing.assert_frame_equal(m.drop(columns="wall_time"), metrics["sequential"].drop(columns="wall_time"),
                                      rtol=1e-4, check_exact=False, obj=backend)


@pytest.mark.slow
def test_a_failed_single_run_leaves_a_failed_summary_and_its_traceback(tmp_path, data_root):
    """Issue 27.1: a run that raises is recorded as a sweep job is: summary.json `failed` with the error, the
    traceback in train.log, and a closing line that says where."""
    out = train(data_root, *SMALL, "rounds=3", f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]",
                "algo=crasher", f"hydra.run.dir={tmp_path}", code=None)
    assert out.returncode == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "crashed on purpose in round 1" in summary["error"]
    log = (tmp_path / "train.log").read_text()
    assert "Traceback" in log and "RuntimeError: crashed on purpose in round 1" in log
    assert f"normfl: failed: RuntimeError('crashed on purpose in round 1'); traceback in {tmp_path}/train.log" \
        in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("half", [["privacy.calibration=accountant"], ["accountant=pld"]])
def test_a_certificate_asked_for_half_way_is_refused(half, tmp_path, data_root):
    """Issue 27.2: either half of the calibration alone fell back to the papers' formula without a word."""
    out = train(data_root, *SMALL, "rounds=2", "algo=dp_normec", *half, f"hydra.run.dir={tmp_path / 'r'}", code=None)
    assert out.returncode == 1 and not (tmp_path / "r").exists()
    key = "accountant" if half[0].startswith("privacy") else "privacy.calibration"
    assert out.stderr.startswith(f"normfl: invalid config: {key}=") and "allowed: " in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_a_run_certifying_more_than_its_target_says_so_at_the_start_and_the_end(tmp_path, data_root):
    """Issue 27.2: the papers' rule at ε = 8 certifies ε_PLD ≈ 84 for DP-FedAvg at p = 0.25 (no amplification
    claimed). The console and the log say so before the first round and after the last; a calibrated run
    certifies at most its target and says nothing."""
    out = train(data_root, *SMALL, "rounds=2", "algo=dp_fedavg", "p=0.25", f"hydra.run.dir={tmp_path / 'paper'}",
                code=None)
    assert out.returncode == 0, out.stderr[-2000:]
    log = (tmp_path / "paper" / "train.log").read_text()
    eps = json.loads((tmp_path / "paper" / "summary.json").read_text())["privacy"]["epsilon_pld"]
    assert eps > 8
    for text in (out.stdout + out.stderr, log):
        assert "privacy: this run will certify ε = " in text and "privacy: this run certifies ε = " in text
        assert f"{eps:.4g} certified (pld): ABOVE the target" in text
    out = train(data_root, *SMALL, "rounds=2", "algo=dp_fedavg", "p=0.25", "privacy.calibration=accountant",
                "accountant=pld", f"hydra.run.dir={tmp_path / 'pld'}", code=None)
    assert out.returncode == 0 and "privacy: this run" not in out.stdout + out.stderr
    assert "certified (pld) |" in out.stdout
    out = train(data_root, *SMALL, "rounds=2", "algo=dp_fedavg", "privacy.noise_multiplier_override=0",
                f"hydra.run.dir={tmp_path / 'none'}", code=None)        # no noise: ε ∞, which JSON writes as null
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((tmp_path / "none" / "summary.json").read_text())["privacy"]["epsilon_pld"] is None
    assert "ε 8 asked, ∞: no noise added |" in out.stdout
    assert "privacy.noise_multiplier_override=0 sets the noise instead of privacy.epsilon" in out.stdout
    assert collect(tmp_path / "none").epsilon[0] == math.inf
    out = train(data_root, *SMALL, "rounds=2", "algo=dp_fed_normec", "p=0.25", "privacy.amplification=true",
                "privacy.calibration=accountant", "accountant=pld", f"hydra.run.dir={tmp_path / 'amplified'}",
                code=None)
    assert out.returncode == 0, out.stderr[-2000:]                     # each client's own noise: the server sees
    why = json.loads((tmp_path / "amplified" / "summary.json").read_text())["privacy"]["not_certified"]
    assert len(why) == 1 and "the server sees who uploads" in why[0]  # who took part, so no amplification for it
    assert "the ε this run reports is not a certificate: the server sees who uploads" in out.stdout
    assert f"ε 8 asked, 8 claimed (pld); not a certificate: {why[0]} |" in out.stdout
    assert collect(tmp_path / "amplified").epsilon[0] is None            # a sweep's table: no certified ε


@pytest.mark.slow
def test_a_sweep_of_many_overrides_runs_in_numbered_folders_and_ends_with_a_table(tmp_path, data_root):
    """Issue 27.3-4: 15 overrides made a sub-directory name too long for the file system. Job folders are the
    job numbers, jobs.csv says which values each ran, each job ends with its line and the sweep with a table."""
    many = [*SMALL, "rounds=2", "clients=4", "algo=normec", "algo.gamma=0.1", "algo.alpha=0.01", "batch_size=16",
            "eval_every=1", "seed=3", "partition=iid", "checkpoint_every=0", "algo.server_norm=false"]
    assert len(many) >= 15
    out = train(data_root, *many, "algo.beta=0.01,0.1", f"hydra.sweep.dir={tmp_path}", multirun=True, code=None)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["0", "1"]
    jobs = pd.read_csv(tmp_path / "jobs.csv")
    assert list(jobs["folder"].astype(str)) == ["0", "1"] and list(jobs["algo.beta"]) == [0.01, 0.1]
    assert list(jobs["status"]) == ["completed", "completed"]
    assert out.stdout.count("normfl: completed in ") == 2
    acc = [json.loads((tmp_path / j / "summary.json").read_text())["final_test_acc"] for j in ("0", "1")]
    assert f"normfl sweep: 2 completed in {tmp_path}" in out.stderr
    table = (tmp_path / "jobs.md").read_text()
    assert table in out.stderr and "algo.beta" in table
    assert all(f"{100 * a:.2f}" in table for a in acc)


@pytest.mark.slow
def test_a_single_run_ends_with_one_line(tmp_path, data_root):
    """Issue 27.4: status, final and best accuracy, ε asked and certified, directory and time, in one line,
    on the console and in the log."""
    out = train(data_root, *SMALL, "rounds=3", "algo=normec", f"hydra.run.dir={tmp_path}", code=None)
    s = json.loads((tmp_path / "summary.json").read_text())
    line = (f"normfl: completed in {s['wall_time_s']:.1f}s | test accuracy {100 * s['final_test_acc']:.2f}% final, "
            f"{100 * s['best_test_acc']:.2f}% best (round {s['best_round']}) | not private | {tmp_path}")
    assert out.stdout.strip().splitlines()[-1] == line
    assert (tmp_path / "train.log").read_text().rstrip().endswith(line)


SIGNAL_AT_STEP = """
import os, runpy, signal, sys
from normfl.run import training
record, at, sig = training.Training.record, int(sys.argv.pop(1)), getattr(signal, sys.argv.pop(1))
def record_then_signal(self, *args):
    record(self, *args)
    if self.step == at:
        os.kill(os.getpid(), sig)
training.Training.record = record_then_signal
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

SUBMITIT_LIKE = """
import os, signal, sys
ckpt = os.path.join(sys.argv[-1].split("=", 1)[1], "checkpoint.pt")       # the last argument: hydra.run.dir=...
def requeue_and_exit(signum, frame):       # what submitit's SIGUSR2 handler does: requeue, then sys.exit(-1)
    print("requeued; checkpoint there:", os.path.exists(ckpt), file=sys.stderr)
    sys.exit(-1)
signal.signal(signal.SIGUSR2, requeue_and_exit)
signal.signal(signal.SIGTERM, lambda *a: print("bypassing SIGTERM", file=sys.stderr))
"""


def interrupt(data_root, *overrides, at_step: int, sig: str = "SIGINT", prelude: str = ""
              ) -> subprocess.CompletedProcess:
    """``train.py`` sent ``sig`` right after step ``at_step`` (a real signal, sent by the process to itself, so
    that it never comes after the run has ended however loaded the machine is); ``prelude`` runs first."""
    cmd = [sys.executable, "-c", prelude + SIGNAL_AT_STEP, str(at_step), sig, "train.py", f"data_root={data_root}",
           *overrides]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize(("reading", "sig"), [("text", "SIGINT"), ("pass", "SIGTERM")])
def test_ctrl_c_saves_a_checkpoint_and_the_printed_command_finishes_the_run_exactly(reading, sig, tmp_path,
                                                                                  data_root):
    """Issue 27.5: after Ctrl-C the message said the same command continues, but without a run directory the
    same command starts over elsewhere, and a run shorter than checkpoint_every had no checkpoint. Now Ctrl-C
    saves one after the step under way (part-way through a pass, too), and the printed command, run as
    printed, ends with the same metrics and parameters as a run never interrupted. SIGTERM (a scheduler's or
    a container's stop, ``kill``) is taken the same way and ends the process with 143, not by the signal."""
    args = [*SMALL, "algo=normec", "clients=4", "rounds=40", "save_params=true", "resume=false", f"reading={reading}",
            "batch_size=50", "eval_every=5"]
    whole = train(data_root, *args, f"hydra.run.dir={tmp_path / 'whole'}", code=None)
    assert whole.returncode == 0, whole.stderr[-2000:]
    cut = tmp_path / "cut"
    out = interrupt(data_root, *args, f"hydra.run.dir={cut}", at_step=13, sig=sig)   # part-way through round 3's pass
    assert out.returncode == 128 + getattr(signal, sig) and (cut / "checkpoint.pt").exists(), out.stderr[-2000:]
    assert "checkpoint saved at step 13 " in out.stderr, out.stderr[-2000:]
    printed = out.stderr.strip().splitlines()[-1].strip()
    assert "hydra.run.dir=" in printed and "resume=false" not in printed
    again = subprocess.run(shlex.split(printed), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = (pd.read_csv(tmp_path / d / "metrics.csv").drop(columns="wall_time") for d in ("whole", "cut"))
    pd.testing.assert_frame_equal(a, b)
    assert np.array_equal(np.load(tmp_path / "whole" / "params.npy"), np.load(cut / "params.npy"))


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="no SIGUSR2 here")
def test_a_schedulers_preemption_signal_saves_a_checkpoint_before_its_handler_requeues(tmp_path, data_root):
    """Under Hydra's SLURM launcher, submitit's SIGUSR2 handler requeues the job and exits; the requeued job
    resumed from its last ``checkpoint_every`` (here: none, so from the start). Now the step under way ends,
    the checkpoint is saved, and only then submitit's handler runs; submitit's SIGTERM handler stays its own."""
    run_dir = tmp_path / "run"
    args = [*SMALL, "algo=normec", "clients=4", "rounds=20", "eval_every=5", "checkpoint_every=0"]
    out = interrupt(data_root, *args, f"hydra.run.dir={run_dir}", at_step=13, sig="SIGUSR2", prelude=SUBMITIT_LIKE)
    assert out.returncode == 255 and "checkpoint saved at step 13 " in out.stderr, out.stderr[-2000:]
    assert "requeued; checkpoint there: True" in out.stderr, out.stderr[-2000:]
    out = interrupt(data_root, *args, f"hydra.run.dir={run_dir}", at_step=17, sig="SIGTERM", prelude=SUBMITIT_LIKE)
    assert out.returncode == 0 and "bypassing SIGTERM" in out.stderr, out.stderr[-2000:]
    assert "resuming from round 13" in (run_dir / "train.log").read_text()


def test_ctrl_c_after_the_run_has_ended_says_so(tmp_path):
    """A Ctrl-C that lands between a run's end and its process's exit (CI once sent one there) found no
    checkpoint and said the command would start the run over; the run had in fact finished."""
    from normfl.run.cli import resume_hint

    (tmp_path / "summary.json").write_text('{"status": "finished"}\n')
    hint = resume_hint(tmp_path)
    assert "had ended before Ctrl-C" in hint and "starts it over" not in hint


@pytest.mark.slow
def test_a_run_that_is_not_private_starts_without_the_privacy_and_statistics_libraries(tmp_path, data_root):
    """dp-accounting and scipy take about a second to import; a run that neither accounts privacy nor audits it
    (``make run``'s α-NormEC) must not pay for them at every start, nor any run for torchvision (about 2 s) once
    its data is in place, nor for pandas (0.4 s)."""
    from normfl.data import load_fashion_mnist

    load_fashion_mnist(data_root, OFFLINE, download=False)             # in place: the offline copy extracted
    code = ("import runpy, sys\n"
            f"sys.argv = ['train.py', *{[*SMALL, 'algo=normec', 'rounds=2', f'data_root={data_root}']!r}, "
            f"'hydra.run.dir={tmp_path}']\n"
            "runpy.run_path('train.py', run_name='__main__')\n"
            "heavy = ('scipy', 'dp_accounting', 'torchvision', 'pandas')\n"
            "print('loaded:', sorted(m for m in heavy if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "normfl: completed" in out.stdout, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "loaded: []"


@pytest.mark.slow
@pytest.mark.parametrize(("betas", "workers", "statuses", "group"), [
    ("0.01,0.1", 2, ["stopped"] * 2 + ["not started"] * 2, True),   # jobs waiting: none starts after Ctrl-C
    ("0.01", 3, ["stopped"] * 2, True),                               # a worker idle: it must not die of Ctrl-C
    ("0.01,0.1", 2, ["stopped"] * 2 + ["not started"] * 2, False),  # SIGTERM to the sweep's process alone
])
def test_ctrl_c_stops_a_joblib_sweep_its_running_jobs_checkpointed_and_the_printed_command_finishes_it(
        betas, workers, statuses, group, tmp_path, data_root):
    """Ctrl-C in a terminal reaches a joblib sweep's process and its workers. joblib met it by killing the
    workers mid-checkpoint (an empty ``.checkpoint.pt.tmp`` and the lock left, a traceback, no command); an
    idle worker died of it, which breaks joblib's pool. Now the running jobs save a checkpoint and end
    ``stopped``, the others never start, the sweep exits 130 with the command that continues it, and that
    command finishes every job, the stopped ones from their checkpoints. SIGTERM to the sweep's process alone
    (``docker stop``) let the running jobs train to their end; now they stop the same way, from the sweep's
    stop file, and the sweep exits 143."""
    sweep = tmp_path / "sweep"
    cmd = train_command(f"data_root={data_root}", *SMALL, "algo=normec", "clients=2", "rounds=3000", "eval_every=500",
                        "checkpoint_every=0", f"algo.beta={betas}", "algo.gamma=0.01,0.1", "hydra/launcher=joblib",
                        f"hydra.launcher.n_jobs={workers}", f"hydra.sweep.dir={sweep}", multirun=True)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)

    def rows(job: int) -> int:                  # metrics.csv's rows so far (written at each evaluation)
        metrics = sweep / str(job) / "metrics.csv"
        return len(metrics.read_text().splitlines()) - 1 if metrics.exists() else 0

    while proc.poll() is None and min(rows(0), rows(1)) < 2:                   # both running jobs under way
        time.sleep(0.01)
    if group:
        os.killpg(proc.pid, signal.SIGINT)                                      # the terminal's Ctrl-C
    else:
        os.kill(proc.pid, signal.SIGTERM)                                       # the sweep's process only
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == (130 if group else 143) and "Traceback" not in err, err[-3000:]
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "1", "jobs.csv", "multirun.yaml"]
    for job in ("0", "1"):
        assert {".hydra", "checkpoint.pt", "metrics.csv", "partition.csv", "train.log"} == {
            p.name for p in (sweep / job).iterdir()}, job                        # no lock, nothing half-written
    assert list(pd.read_csv(sweep / "jobs.csv")["status"]) == statuses
    printed = err.strip().splitlines()[-1].strip()
    assert printed.endswith(f"hydra.sweep.dir={sweep}") and " -m " in printed
    if workers > 2 or not group:                                # continuing is the same either way
        return
    again = subprocess.run(shlex.split(printed), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "normfl sweep: 4 completed" in again.stderr, again.stderr[-3000:]
    for job in ("0", "1"):
        assert "resuming from round" in (sweep / job / "train.log").read_text(), job


def test_a_value_typed_with_a_tilde_is_made_readable_to_hydra(monkeypatch):
    """Hydra's grammar refuses an unquoted ~, which a shell passes as it is for a dotted key: normfl's keys get
    it quoted (normfl expands it where it reads the path), Hydra's own the home directory written out; a sweep's
    list value by value; anything else untouched."""
    from normfl.run.cli import home_paths

    monkeypatch.setenv("HOME", "/home/u")
    typed = ["dataset.path=~/x.npz", "data_root=~", "+offline_data=~/d,data", "hydra.run.dir=~/runs/a",
             "hydra.sweep.dir=~", "rounds=3", "dataset.path='~/q.npz'", "model.hidden=[~]", "name=a~b"]
    assert home_paths(typed) == ["dataset.path='~/x.npz'", "data_root='~'", "+offline_data='~/d',data",
                                 "hydra.run.dir=/home/u/runs/a", "hydra.sweep.dir=/home/u", "rounds=3",
                                 "dataset.path='~/q.npz'", "model.hidden=[~]", "name=a~b"]

"""Checkpoint and resume: a run killed by a signal continues from its last checkpoint and ends with
the same metrics and parameters as a run never interrupted; finished runs are not rerun."""

import json
import signal
import subprocess
import time

import numpy as np
import pandas as pd
import pytest

from tests.helpers import CONF, REPO, composed, resumed_equals_whole, train, train_command

BASE = ["dataset=fashion_mnist", "model=logreg", "dataset.train_limit=2000", "dataset.test_limit=500",
        "rounds=300", "eval_every=50", "checkpoint_every=20", "progress=false", "backend=sequential",
        "save_params=true", "threads=1"]
ALGOS = {
    "normec": ["algo=normec", "clients=4", "algo.beta=0.1", "algo.gamma=0.1"],
    "dp_fed_normec": ["algo=dp_fed_normec", "clients=6", "p=0.5", "algo.beta=0.1", "algo.gamma=0.1",
                      "algo.local_steps=2"],
    "dp_normfedavg": ["algo=dp_normfedavg", "clients=6", "algo.cohort_size=3", "algo.local_steps=2",
                      "batch_size=16"],
}


def command(data_root, run_dir, *overrides):
    return train_command(f"data_root={data_root}", *BASE, *overrides, f"hydra.run.dir={run_dir}")


def train_in(data_root, run_dir, *overrides, **kw):
    """``python train.py`` on ``BASE`` and ``overrides`` in ``run_dir``."""
    return train(data_root, *BASE, *overrides, f"hydra.run.dir={run_dir}", **kw)


def kill_after_checkpoint(data_root, run_dir, *overrides):
    """Start the run, SIGKILL it once it has written a checkpoint and some metrics."""
    proc = subprocess.Popen(command(data_root, run_dir, *overrides), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while proc.poll() is None and not ((run_dir / "checkpoint.pt").exists() and (run_dir / "metrics.csv").exists()):
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("algo", list(ALGOS))
def test_killed_run_resumes_to_identical_outputs(algo, tmp_path, data_root):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    kill_after_checkpoint(data_root, killed, *ALGOS[algo])
    assert (killed / "checkpoint.pt").exists() and not (killed / "summary.json").exists()   # killed part-way
    assert not list(killed.glob(".*.tmp"))                                   # no half-written file left
    rows_at_kill = len(pd.read_csv(killed / "metrics.csv"))
    assert 1 <= rows_at_kill < 301
    if algo == "normec":                 # resume=false refused at its data (after the config) keeps the checkpoint
        nowhere = tmp_path / "no-data"
        out = train_in(nowhere, killed, *ALGOS[algo], "resume=false", f"offline_data={nowhere}", code=None)
        assert out.returncode == 1 and "not found" in out.stderr and (killed / "checkpoint.pt").exists()
    (killed / ".metrics.csv.1.2.tmp").write_text("")                        # as a kill mid-write leaves it
    out = train_in(data_root, killed, *ALGOS[algo])
    assert "resuming from round" in out.stdout + out.stderr
    assert not list(killed.glob(".*.tmp"))                                   # the resumed run cleared it
    train_in(data_root, whole, *ALGOS[algo])
    a, b = (pd.read_csv(d / "metrics.csv").drop(columns="wall_time") for d in (whole, killed))
    pd.testing.assert_frame_equal(a, b)
    assert np.array_equal(np.load(whole / "params.npy"), np.load(killed / "params.npy"))
    assert not (killed / "checkpoint.pt").exists()                           # removed once the run ended


@pytest.mark.slow
def test_finished_run_is_not_rerun_and_another_config_is_refused(tmp_path, data_root):
    train_in(data_root, tmp_path, *ALGOS["normec"], "rounds=30")
    before = (tmp_path / "summary.json").read_text()
    out = train_in(data_root, tmp_path, *ALGOS["normec"], "rounds=30", "threads=2")  # threads: same run
    assert "already holds this config's finished run" in out.stdout + out.stderr
    assert (tmp_path / "summary.json").read_text() == before
    kill_after_checkpoint(data_root, tmp_path / "k", *ALGOS["normec"])     # leaves a lock of a dead process
    on_disk = {p.name: p.read_bytes() for p in (tmp_path / "k").rglob("*") if p.is_file() and p.name != ".lock"}
    for extra in ((), ("resume=false",)):     # another config's checkpoint is never taken over or removed
        refused = train_in(data_root, tmp_path / "k", *ALGOS["normec"], "seed=7", *extra, code=None)
        assert refused.returncode == 1 and "it holds a run of config normec-" in refused.stderr, refused.stderr
        assert {p.name: p.read_bytes() for p in (tmp_path / "k").rglob("*") if p.is_file()} == on_disk
    out = train_in(data_root, tmp_path / "k", *ALGOS["normec"])              # its own config continues it
    assert "resuming from round" in out.stdout + out.stderr


@pytest.mark.slow
def test_sweep_rerun_skips_finished_jobs_and_records_a_crash(tmp_path, data_root):
    """A job that crashes is recorded as failed with its error while the others finish; running the
    same sweep again in the same sweep dir leaves the finished jobs alone, and another sweep there is refused
    before it starts."""
    args = [*BASE, "rounds=4", f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "algo=normec,crasher",
            "clients=4", f"hydra.sweep.dir={tmp_path}"]
    first = train(data_root, *args, multirun=True, code=None)
    assert first.returncode == 1 and f"normfl sweep: 1 completed, 1 failed in {tmp_path}\n" in first.stderr, \
        first.stderr[-3000:]
    assert "\n  job 1 failed (algo=crasher): RuntimeError('crashed on purpose in round 1')\n" in first.stderr
    jobs = {d.name: d for d in tmp_path.iterdir() if d.is_dir() and d.name[0].isdigit()}
    done, crashed = (json.loads((jobs[j] / "summary.json").read_text()) for j in ("0", "1"))
    assert done["status"] == "completed"
    assert crashed["status"] == "failed" and "crashed on purpose in round 1" in crashed["error"]
    before = (jobs["0"] / "summary.json").read_text()
    again = train(data_root, *args, multirun=True, code=None)
    assert "already holds this config's finished run" in again.stdout + again.stderr
    assert (jobs["0"] / "summary.json").read_text() == before
    table = (tmp_path / "jobs.csv").read_text()                # another grid here would have replaced it
    other = train(data_root, *args[:-3], "algo=crasher,normec", *args[-2:], multirun=True, code=None)
    assert other.returncode == 1 and other.stderr.startswith(f"normfl: invalid config: hydra.sweep.dir='{tmp_path}'")
    assert "(its job 0 ran algo=normec; here: algo=crasher)" in other.stderr
    assert (tmp_path / "jobs.csv").read_text() == table and (jobs["0"] / "summary.json").read_text() == before


@pytest.mark.slow
def test_killed_stacked_sweep_resumes_to_identical_outputs(tmp_path, data_root):
    """hydra/launcher=stacked: the user's sweep command is unchanged and every job gets its run directory with
    its config; runs trained side by side keep a checkpoint each, so a sweep killed part-way and run again
    ends with the metrics and parameters of the sweep never interrupted."""
    def args(sweep_dir):
        return [*BASE, "rounds=120", "hydra/launcher=stacked", "backend=stacked", "algo=normec", "clients=4",
                "algo.beta=0.1,1.0", f"hydra.sweep.dir={sweep_dir}"]

    killed, whole = tmp_path / "killed", tmp_path / "whole"
    proc = subprocess.Popen(train_command(f"data_root={data_root}", *args(killed), multirun=True), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None and len(list(killed.glob("*/checkpoint.pt"))) < 2:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not list(killed.glob("*/summary.json"))                           # killed part-way
    again = train(data_root, *args(killed), multirun=True, code=None)
    assert again.returncode == 0 and (again.stdout + again.stderr).count("resuming from round") == 2, again.stderr
    first = train(data_root, *args(whole), multirun=True, code=None)
    assert first.returncode == 0, first.stderr[-3000:]
    jobs = sorted(d.name for d in whole.iterdir() if d.is_dir())
    assert [j.split("_", 1)[0] for j in jobs] == ["0", "1"]
    for job in jobs:
        assert (killed / job / ".hydra" / "config.yaml").is_file()
        assert json.loads((killed / job / "summary.json").read_text())["backend"] == "stacked"
        a, b = (pd.read_csv(d / job / "metrics.csv").drop(columns="wall_time") for d in (whole, killed))
        pd.testing.assert_frame_equal(a, b)
        assert np.array_equal(np.load(whole / job / "params.npy"), np.load(killed / job / "params.npy"))


# -- Resume in-process: every algorithm config and every model family --------------------------------------------
# A checkpoint that forgets anything a round changes (a DP-SGD step counter, an error-feedback memory, BatchNorm's
# running statistics, the clients' batch streams, the canaries' scores) makes a resumed run end elsewhere, or spend
# more privacy than it reports, under the same run key. Each case below trains a run whole and the same run stopped
# after its last checkpoint plus some unsaved rounds (what a kill loses), then continued from a fresh build, and
# compares everything a run reports: every metrics column but wall time, the parameters, the buffers, the
# algorithm's state and the summary (its privacy block included).

SMALL = {"dataset": "fashion_mnist", "dataset.train_limit": 400, "dataset.test_limit": 100, "model": "logreg",
         "clients": 4, "progress": "false", "save_params": "true", "backend": "sequential", "threads": 1, "rounds": 12,
         "eval_every": 3, "checkpoint_every": 4}     # an override of the same key replaces its value here
DPSGD = ["algo.sample_rate=0.1", "algo.sigma=1.5", "privacy.epsilon=8"]
EVERY_ALGO = {                                  # one case per algorithm config (conf/algo), on logreg
    "normec": ["algo=normec"],
    "dp_normec": ["algo=dp_normec", "privacy.calibration=accountant", "accountant=pld"],
    "clip21": ["algo=clip21"],
    "dp_clip21": ["algo=dp_clip21"],
    "dpsgd_norm": ["algo=dpsgd_norm", "algo.gamma=0.1"],
    "fed_normec": ["algo=fed_normec", "p=0.5", "algo.local_steps=2"],
    "dp_fed_normec": ["algo=dp_fed_normec", "p=0.5", "algo.local_steps=2", "privacy.amplification=true"],
    "fedavg": ["algo=fedavg", "algo.participation=cohort", "algo.cohort_size=2"],
    "dp_fedavg": ["algo=dp_fedavg", "algo.noise_by=server", "p=0.5"],
    "normfedavg": ["algo=normfedavg", "algo.local_steps=2", "batch_size=16", "algo.cohort_size=3"],
    "dp_normfedavg": ["algo=dp_normfedavg", "algo.local_steps=2", "batch_size=16", "algo.cohort_size=3"],
    "nfa_binomial": ["algo=nfa_binomial", "algo.local_steps=2", "batch_size=16"],
    "nfa_clip_tdl": ["algo=nfa_clip_tdl", "algo.local_steps=2", "batch_size=16", "privacy.epsilon=0.5"],
    "nfa_fedavg": ["algo=nfa_fedavg", "algo.local_steps=2", "batch_size=16"],
    "dpfl": ["algo=dpfl", "algo.tau=2", "algo.rc_override=18", *DPSGD],          # the budget ends it in round 9
    "ali_dpfl": ["algo=ali_dpfl", "algo.rc_override=30", *DPSGD],                 # τ chosen from round to round
}
RESNET = ["model=resnet20", "clients=2", "dataset.train_limit=64", "batch_size=8", "rounds=8"]
EVERY_MODEL = {                                 # each model family; BatchNorm with each family that allows it
    "mlp-dp_normfedavg": ["model=mlp", "model.hidden=[32]", *EVERY_ALGO["dp_normfedavg"]],
    "cnn-ali_dpfl": ["model=cnn", "model.hidden=32", *EVERY_ALGO["ali_dpfl"]],
    "resnet20-normec": [*RESNET, "algo=normec"],
    "resnet20-dp_fed_normec": [*RESNET, *EVERY_ALGO["dp_fed_normec"]],
    "resnet20-dp_normfedavg": [*RESNET, *EVERY_ALGO["dp_normfedavg"][:-2], "algo.cohort_size=1"],
    "resnet20_group-dpfl": [*RESNET, "model.norm=group", *EVERY_ALGO["dpfl"]],     # DP-SGD refuses BatchNorm
}
SPECIAL = {
    # a Ctrl-C saves part-way through a pass (reading=pass: a round is a pass of steps): its steps so far carry over
    "pass-ctrl_c": (["algo=dp_normec", "reading=pass", "batch_size=25", "rounds=3", "eval_every=1",
                     "checkpoint_every=0", "privacy.calibration=accountant", "accountant=rdp"], 6),
    # the canaries audited beside a run keep the scores they have seen
    "audit-dp_normec": (["algo=dp_normec", "audit.canaries=50", "privacy.calibration=accountant", "accountant=pld"],
                        None),
    # canary clients in the run: their scores' sums, the steps seen, marked and replayed carry over
    "audit-release-dp_fed_normec": (["algo=dp_fed_normec", "p=0.5", "audit.canaries=50", "audit.mode=release",
                                    "privacy.calibration=accountant", "accountant=pld"], None),
}


def test_every_algorithm_config_has_a_case():
    assert set(EVERY_ALGO) == {path.stem for path in (CONF / "algo").glob("*.yaml")}


def compose_config(data_root, *overrides):
    given = {o.split("=", 1)[0] for o in overrides}
    small = [f"{k}={v}" for k, v in SMALL.items() if k not in given]
    return composed(*small, f"data_root={data_root}", *overrides)


@pytest.mark.slow
@pytest.mark.parametrize("case", [*EVERY_ALGO, *EVERY_MODEL])
def test_a_run_resumed_in_process_ends_as_the_run_never_stopped(case, tmp_path, data_root):
    overrides = EVERY_ALGO.get(case) or EVERY_MODEL[case]
    summary = resumed_equals_whole(compose_config(data_root, *overrides), tmp_path)
    if "resnet20" in case and "group" not in case:
        assert summary["privacy"] is None or summary["privacy"]["not_covered"]     # BatchNorm: buffers were compared
    if summary["algo"] in ("dpfl", "ali_dpfl"):       # the steps spent are the steps the rounds took, within budget
        metrics = pd.read_csv(tmp_path / "killed" / "metrics.csv")
        assert summary["privacy"]["steps_taken"] == metrics["steps_total"].iloc[-1] == metrics["tau"].sum()
        assert metrics["steps_total"].iloc[-1] <= summary["privacy"]["R_c"]


@pytest.mark.parametrize("case", SPECIAL)
def test_a_run_resumed_mid_pass_or_audited_ends_as_the_run_never_stopped(case, tmp_path, data_root):
    overrides, kill_at = SPECIAL[case]
    summary = resumed_equals_whole(compose_config(data_root, *overrides), tmp_path, kill_at)
    if case.startswith("audit"):
        assert summary["audit"]["steps_observed"] == summary["steps"]
    said_resumed(summary, tmp_path)


def said_resumed(summary: dict, tmp_path) -> None:
    """A resumed run's closing line gives its rounds' time over every start (its last row's wall time), and the
    round it was taken up at; the run made whole says neither."""
    from normfl.results import closing_line

    whole = json.loads((tmp_path / "whole" / "summary.json").read_text())
    rows = pd.read_csv(tmp_path / "killed" / "metrics.csv")
    assert whole["resumed_at_round"] is None and "resumed at round" not in closing_line(whole, tmp_path)
    assert summary["training_time_s"] == pytest.approx(rows["wall_time"].iloc[-1], rel=1e-6)
    assert 0 < summary["resumed_at_round"] < summary["final_round"]
    took = f"of training, resumed at round {summary['resumed_at_round']}"
    assert f"completed in {summary['training_time_s']:.1f}s {took} |" in closing_line(summary, tmp_path)


@pytest.mark.parametrize("forgetful", ["ForgetfulMomentum", "LateMomentum"])
def test_round_state_left_out_of_the_declaration_stops_the_run_before_its_first_checkpoint(forgetful, tmp_path,
                                                                                           data_root):
    """An algorithm (a user's, from outside normfl) whose round changes an attribute its ``state`` does not name
    would resume from a checkpoint without it and end elsewhere under the same run key: the run stops in its
    first rounds, before a checkpoint, naming the attribute and the fix; declared, the same algorithm resumes as
    the run never stopped. The attribute is caught whether set-up gave it a value or round 0 made it."""
    from normfl.checkpoint import UndeclaredState
    from normfl.run import run

    cfg = compose_config(data_root, "algo=normec", f"algo._target_=tests.helpers.{forgetful}",
                         "checkpoint_every=2")
    with pytest.raises(UndeclaredState) as err:
        run(cfg, tmp_path / "forgetful")
    said = str(err.value)
    assert f"tests.helpers.{forgetful} changed 'm' in round 1" in said and "to the class's `state`" in said
    assert not (tmp_path / "forgetful" / "checkpoint.pt").exists()
    resumed_equals_whole(compose_config(data_root, "algo=normec", "algo._target_=tests.helpers.Momentum"),
                         tmp_path / "declared")

"""A user's own algorithm, from outside normfl (docs/own-algorithm.md). The page's example, DP-FedAvg with server
momentum (docs/own-algorithm/), found as Hydra users expect (its module on PYTHONPATH, its config through
--config-dir), and a held-out one written on the base class alone (tests/outside/fedadam.py: DP-FedAdam) get what
a built-in algorithm gets: their keys checked, their noise calibrated and ε certified, a canary audit (which a
tenfold noise cut fails), resume, runs side by side, collect. And no module of the runner names an algorithm."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import normfl.algorithms
from normfl.algorithms import Algorithm
from normfl.algorithms.base import GaussianAlgorithm
from normfl.config import ConfigError, checks, validate
from normfl.privacy import mechanisms
from normfl.run import run
from tests.helpers import OFFLINE, REPO, assert_same_run, composed, resumed_equals_whole, train

EXAMPLE, OUTSIDE = REPO / "docs" / "own-algorithm", REPO / "tests" / "outside"
SMALL = ["dataset=fashion_mnist", "model=logreg", "dataset.train_limit=400", "dataset.test_limit=100", "clients=4",
         "rounds=12", "eval_every=4", "checkpoint_every=4", "progress=false", "save_params=true", "threads=1",
         "privacy.delta=1e-5", "privacy.calibration=accountant", "accountant=pld"]


def train_outside(cwd: Path, data_root, *overrides, multirun=False) -> subprocess.CompletedProcess:
    """``python train.py --config-dir docs/own-algorithm/conf algo=dp_fedavgm ...`` from ``cwd``, outside the
    repository, with the example's folder on PYTHONPATH: nothing of normfl edited or told about it."""
    path = os.pathsep.join(p for p in (str(EXAMPLE), os.environ.get("PYTHONPATH")) if p)
    return train(data_root, "algo=dp_fedavgm", *SMALL, f"offline_data={OFFLINE}", *overrides, multirun=multirun,
                 options=("--config-dir", str(EXAMPLE / "conf")), cwd=cwd, env={**os.environ, "PYTHONPATH": path},
                 code=None)


def config(monkeypatch, where: Path, algo: str, data_root, *overrides):
    """The same run composed in-process: ``where`` on sys.path, ``where/conf`` on Hydra's search path."""
    monkeypatch.syspath_prepend(str(where))
    return composed(f"hydra.searchpath=[file://{where / 'conf'}]", f"algo={algo}", *SMALL, f"data_root={data_root}",
                    f"offline_data={OFFLINE}", *overrides)


def example(monkeypatch, data_root, *overrides):
    return config(monkeypatch, EXAMPLE, "dp_fedavgm", data_root, *overrides)


def held_out(monkeypatch, data_root, *overrides):
    return config(monkeypatch, OUTSIDE, "dp_fedadam", data_root, *overrides)


# -- the page's example --------------------------------------------------------------------------------------------


def test_the_page_shows_the_example_as_it_is_run():
    page = (REPO / "docs" / "own-algorithm.md").read_text()
    blocks = re.findall(r"```(python|yaml)\n(.*?)```", page, re.S)
    assert blocks == [("python", (EXAMPLE / "fedavgm.py").read_text()),
                      ("yaml", (EXAMPLE / "conf" / "algo" / "dp_fedavgm.yaml").read_text())]
    assert len((EXAMPLE / "fedavgm.py").read_text().splitlines()) <= 42
    assert "[Add your own algorithm](docs/own-algorithm.md)" in (REPO / "README.md").read_text()


def test_what_the_page_says_of_the_examples_code_holds(monkeypatch, tmp_path, data_root):
    """"Reading the example": ``self.p`` is the base class's, read from the ``sampling`` setup made; ``clients.grads``
    without ids gives every client's row, with ids those clients' rows in their order; the server state ``m`` is
    ``[d]``; side by side the group's x and ``m`` are ``[R, d]``, ``mu`` a column ``[R, 1]``, a client memory
    ``[R, n, d]``; a class without scalars (the held-out DP-FedAdam) steps alone."""
    import torch

    from normfl.run import start, vectorized

    t = start(example(monkeypatch, data_root, "p=0.25", "backend=stacked"), tmp_path / "one")
    d = t.x.numel()
    assert "p" not in vars(t.algo) and t.algo.p == t.algo.sampling.p == t.algo.bernoulli_p == 0.25
    G, loss = t.clients.grads(t.x)
    assert G.shape == (4, d) and loss.shape == (4,) and t.algo.m.shape == (d,)
    for ids in ([2, 0], [3]):                              # those clients' rows, in their order
        peeked = t.clients.peek(torch.tensor(ids))           # their next batches, left in place
        rows, _ = t.clients.grads(t.x.expand(len(ids), d), ids=torch.tensor(ids))
        alone, _ = t.clients.grads(t.x, batches=peeked)
        assert rows.shape == (len(ids), d) and torch.allclose(rows, alone)
    t.rundir.release()
    pair = [start(example(monkeypatch, data_root, "backend=stacked", f"algo.mu={mu}"), tmp_path / str(mu))
            for mu in (0.5, 0.9)]
    group = vectorized.Group(pair)
    assert group.X.shape == (2, d) and group.box.m.shape == (2, d) and group.box.mu.shape == (2, 1)
    for u in pair:
        u.rundir.release()
    ec = [start(composed(*SMALL, f"data_root={data_root}", "algo=dp_normec", "backend=stacked", f"algo.gamma={g}"),
                tmp_path / f"ec{g}") for g in (0.1, 0.2)]
    assert vectorized.Group(ec).box.g.shape == (2, 4, d)                # a client memory side by side
    for u in ec:
        u.rundir.release()
    adam = start(held_out(monkeypatch, data_root, "backend=stacked"), tmp_path / "adam")
    assert adam.algo.scalars is None and vectorized.group_key(adam) is None    # steps alone
    adam.rundir.release()


@pytest.mark.slow
def test_the_example_trains_certifies_its_target_and_its_audit_is_consistent(tmp_path, data_root):
    out = train_outside(tmp_path, data_root, "p=0.5", "rounds=20", "privacy.epsilon=2", "audit.canaries=1000",
                        f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["algo"] == "dp_fedavgm" and summary["final_round"] == 20
    privacy, audit = summary["privacy"], summary["audit"]
    assert privacy["calibration"] == "solved with pld" and privacy["sampling_rate"] == 0.5
    assert 0.999 * 2 <= privacy["epsilon_pld"] <= 2                      # the target, nearly all of it spent
    assert privacy["std_on"] == "Clip_β(∇f_i(x^k)), norm ≤ β = 1, weighted by 1/p = 2"
    assert audit["verdict"] == "consistent with the certificate" and audit["steps_observed"] == 20, audit
    assert audit["eps_lower"] < audit["eps_certified"] == privacy["epsilon_pld"]
    assert "ε 2 asked, 2 certified (pld)" in out.stdout


def test_a_key_the_example_does_not_take_or_a_bad_value_is_refused_by_name(monkeypatch, data_root):
    with pytest.raises(ConfigError, match=r"algo.momentum=0.5; allowed: the keys of algo=dp_fedavgm: beta, gamma, "
                                          r"mu, name, p, private"):
        validate(example(monkeypatch, data_root, "+algo.momentum=0.5"))
    with pytest.raises(ConfigError, match=r"algo.mu=1.5; allowed: a number in \[0, 1\), finite"):   # its own check
        validate(example(monkeypatch, data_root, "algo.mu=1.5"))
    with pytest.raises(ConfigError, match=r"algo.gamma=-1; allowed: a number > 0"):           # its family's
        validate(example(monkeypatch, data_root, "algo.gamma=-1"))
    with pytest.raises(ConfigError, match=r"algo.mu=0.5; allowed: 0.9 without momentum"):   # rules.unread's default:
        checks.unread(example(monkeypatch, data_root, "algo.mu=0.5"), "algo.mu", "without momentum")   # its own
    checks.unread(example(monkeypatch, data_root, "algo.mu=0.9"), "algo.mu", "without momentum")


@pytest.mark.slow
def test_the_example_with_a_tenth_of_its_noise_is_refuted_by_its_audit(monkeypatch, tmp_path, data_root):
    real = mechanisms._gaussian
    monkeypatch.setattr(mechanisms, "_gaussian", lambda v, std, gen: real(v, std / 10, gen))
    audit = run(example(monkeypatch, data_root, "rounds=20", "privacy.epsilon=1", "audit.canaries=600"),
                tmp_path)["audit"]
    assert audit["verdict"] == "refutes the certificate", audit
    assert max(audit["eps_lower"], audit["eps_lower_curve"]) > audit["eps_certified"]


@pytest.mark.slow
def test_a_killed_run_of_the_example_resumes_as_it_never_stopped(monkeypatch, tmp_path, data_root):
    summary = resumed_equals_whole(example(monkeypatch, data_root, "p=0.5", "backend=sequential",
                                           "audit.canaries=50"), tmp_path)
    assert summary["audit"]["steps_observed"] == summary["steps"] == 12


@pytest.mark.slow
def test_runs_of_the_example_side_by_side_equal_the_runs_alone_and_collect_draws_them(monkeypatch, tmp_path,
                                                                                      data_root):
    """Four runs step as one until the two shorter end; the two longer go on as a group made from their own state
    (views of the first group's, though the example's round binds ``m`` anew each round)."""
    out = train_outside(tmp_path, data_root, "hydra/launcher=stacked", "backend=stacked", "p=0.5",
                        "algo.mu=0.5,0.9", "rounds=8,12", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                        "hydra.sweep.subdir=${algo.mu}-${rounds}", multirun=True)
    assert out.returncode == 0, out.stderr[-3000:]
    for mu, rounds in [(m, r) for m in (0.5, 0.9) for r in (8, 12)]:
        together = tmp_path / "sweep" / f"{mu}-{rounds}"
        summary = json.loads((together / "summary.json").read_text())
        assert summary["capture"].startswith(f"{4 if rounds == 8 else 2} runs side by side, one vectorized round")
        alone = tmp_path / "alone" / f"{mu}-{rounds}"
        run(example(monkeypatch, data_root, "backend=stacked", "p=0.5", f"algo.mu={mu}", f"rounds={rounds}"), alone)
        assert_same_run(alone, together)
    jobs = (tmp_path / "sweep" / "jobs.md").read_text()                  # the sweep's own table
    assert jobs.count(" completed ") == 4 and "algo.mu" in jobs, jobs
    plot = tmp_path / "curves.png"
    table = subprocess.run([sys.executable, "-m", "normfl.collect", str(tmp_path / "sweep"), "--plot", str(plot)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0 and plot.stat().st_size > 0, table.stderr
    assert table.stdout.startswith("| rounds | algo.mu | n | status |") and table.stdout.count(" completed ") == 4


# -- a held-out algorithm, on the base class ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_held_out_algorithm_trains_privately_is_audited_and_resumes(monkeypatch, tmp_path, data_root):
    summary = run(held_out(monkeypatch, data_root, "rounds=20", "privacy.epsilon=2", "audit.canaries=1000"),
                  tmp_path / "audited")
    assert summary["status"] == "completed" and 0.999 * 2 <= summary["privacy"]["epsilon_pld"] <= 2
    assert summary["audit"]["verdict"] == "consistent with the certificate", summary["audit"]
    inband = run(held_out(monkeypatch, data_root, "rounds=20", "privacy.epsilon=2", "audit.canaries=1000",
                          "audit.mode=inband"), tmp_path / "inband")["audit"]          # canaries in its own round
    assert inband["verdict"] == "consistent with the certificate" and inband["steps_observed"] == 20, inband
    learnt = run(held_out(monkeypatch, data_root, "algo.private=false", "accountant=paper",
                          "privacy.calibration=paper"), tmp_path / "learnt")
    assert learnt["final_test_acc"] > 0.6 and learnt["privacy"] is None
    resumed_equals_whole(held_out(monkeypatch, data_root, "backend=sequential"), tmp_path / "resumed")


def test_a_held_out_algorithm_with_round_state_left_undeclared_is_stopped_naming_it(monkeypatch, tmp_path,
                                                                                   data_root):
    from normfl.checkpoint import UndeclaredState

    with pytest.raises(UndeclaredState, match=r"fedadam.ForgetfulFedAdam changed 'v' in round 1"):
        run(held_out(monkeypatch, data_root, "algo._target_=fedadam.ForgetfulFedAdam"), tmp_path)
    assert not (tmp_path / "checkpoint.pt").exists()


# -- nothing else names an algorithm -------------------------------------------------------------------------------


def named_algorithms() -> set[str]:
    """The classes of normfl.algorithms a run is built from (the two bases a user builds on aside)."""
    found = {obj for mod in vars(normfl.algorithms).values() if isinstance(mod, type(normfl))
             for obj in vars(mod).values() if isinstance(obj, type) and issubclass(obj, Algorithm)}
    return {cls.__name__ for cls in found} - {"Algorithm", "GaussianAlgorithm"}


def names_in(path: Path, classes: set[str]) -> list[str]:
    """Where the code of ``path`` names one of ``classes``: as a name, an attribute, an import, or a dotted
    target string (``normfl.algorithms[.module].Class``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute)
                 else [a.name for a in node.names] if isinstance(node, ast.ImportFrom)
                 else [node.value.rsplit(".", 1)[-1]] if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and node.value.startswith("normfl.algorithms.") else [])
        found += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n in classes]
    return found


def test_no_module_outside_the_algorithms_names_one():
    """What normfl knows of an algorithm it reads from the class's declarations (``Algorithm``: ``state``,
    ``scalars``, ``captures_round``, ``canaries``, ``check``, ...), so a user's algorithm gets all of it."""
    classes = named_algorithms()
    assert {"NormEC", "Clip21", "EF21", "FedAvg", "FedNormEC", "DPSGDNorm", "NormFedAvg", "DPFL"} <= classes
    assert GaussianAlgorithm.__name__ not in classes
    runner = [p for p in (REPO / "normfl").rglob("*.py") if "algorithms" not in p.relative_to(REPO / "normfl").parts]
    found = [hit for p in [*runner, *(REPO / "scripts").glob("*.py"), REPO / "train.py"]
             for hit in names_in(p, classes)]
    assert not found, found


@pytest.mark.slow
def test_a_stop_its_user_causes_is_one_line_with_the_mend_and_the_traceback_in_the_log(tmp_path, data_root):
    """An upload beyond its bound (the example without its clip) and round state left undeclared (the held-out
    ForgetfulFedAdam) stop ``train.py`` with exit status 1 and one ``normfl:`` line saying the cause and the mend; the
    traceback is in the run's log, and on the console with NORMFL_TRACEBACK=1 (or hydra.verbose=true)."""
    unclipped = tmp_path / "unclipped"
    unclipped.mkdir()
    source = (EXAMPLE / "fedavgm.py").read_text()
    (unclipped / "fedavgm.py").write_text(source.replace("sent = self.privatize(self.bounding(G), k)",
                                                         "sent = self.privatize(G, k)"))
    cases = {"privacy": (unclipped, EXAMPLE / "conf", "dp_fedavgm", "", r"normfl: failed: privacy: an upload handed to "
                         r"the gaussian privatizer has l2 norm [\d.]+ \(row \d+\), above the sensitivity 1 .* the "
                         r"algorithm must bound each upload \(clip or normalize it to that norm\) before privatizing "
                         r"it; traceback in \S+train.log"),
             "state": (OUTSIDE, OUTSIDE / "conf", "dp_fedadam", "algo._target_=fedadam.ForgetfulFedAdam",
                       r"normfl: failed: fedadam.ForgetfulFedAdam changed 'v' in round 1 .* Add 'v' to the class's "
                       r"`state`")}
    for name, (path, conf, algo, extra, said) in cases.items():
        args = [f"algo={algo}", *([extra] if extra else []), *SMALL, f"offline_data={OFFLINE}"]
        env = {**os.environ, "PYTHONPATH": str(path)}
        for verbose in (False, True):
            run_dir = tmp_path / f"{name}-{verbose}"
            out = train(data_root, *args, f"hydra.run.dir={run_dir}", options=("--config-dir", str(conf)), code=1,
                        env={**env, **({"NORMFL_TRACEBACK": "1"} if verbose else {})})
            shown = out.stdout + out.stderr
            assert re.search(said, shown), shown[-3000:]
            assert ("Traceback" in shown) == verbose, shown[-3000:]
            assert "Traceback" in (run_dir / "train.log").read_text()

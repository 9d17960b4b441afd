"""A device call's prepared job (scripts/gpu_records.py) and the main job on a GPU (scripts/main_job.py): what
they would train, in what order and how many side by side, and that the main job's run is NORMEC-T2's cell and
becomes its record. Checked on the CPU, so that no device minute is spent finding these out."""

from __future__ import annotations

import json
import shutil
import tarfile

import torch
from omegaconf import OmegaConf

from normfl.config import config_key
from normfl.reproduce import jobs, records
from normfl.reproduce.paper import paper_value, param_label
from tests.helpers import REPO, script

main_job, gr = script("main_job"), script("gpu_records")


def test_make_run_on_a_gpu_is_the_paper_profiles_cell_and_becomes_its_record(tmp_path, capsys):
    """On a GPU the main job runs NORMEC-T2's SN β = γ = 0.1 cell exactly as the paper profile does (the same
    key, so the campaign and the figures find it), and a finished run of it becomes that cell's record; a
    paper-profile run of another setting, or a run that did not finish, does not."""
    cell = next(job for job in jobs.jobs("normec_t2", "paper") if job.params.get("experiment") == "normec_np_sn"
                and job.params["algo.beta"] == job.params["algo.gamma"] == 0.1)
    assert "precision=bf16" in main_job.GPU and "profile=paper" in main_job.GPU
    for name, overrides, status in (("cell", (), "completed"), ("stopped", (), "failed"),
                                    ("other", ("algo.beta=0.5",), "completed")):
        cfg = jobs.compose((*main_job.GPU, *overrides))
        key = config_key(cfg)
        assert (key == cell.key) == (name != "other"), name
        d = tmp_path / name
        (d / ".hydra").mkdir(parents=True)
        OmegaConf.save(cfg, d / ".hydra" / "config.yaml")
        (d / "metrics.csv").write_text("round,test_acc\n0,0.1\n300,0.85\n")
        (d / "summary.json").write_text(json.dumps({"status": status, "config_key": key, "profile": "paper"}))
        main_job.record(d)
        made = (records.RECORDS / key / "summary.json").is_file()
        assert made == (name == "cell"), name
        if made:
            assert f"record added: {records.RECORDS / key}" in capsys.readouterr().out
            shutil.rmtree(records.RECORDS / key)


def test_the_best_cells_are_the_eight_the_paper_prints_in_the_paper_profile():
    """Per block (with SN, without) and β, the run with the γ Table 2 prints: 8 runs, the main job's among them,
    each the paper profile's (one pass a round, every pass evaluated, bf16)."""
    cells = gr.best_cells("paper")
    assert len(cells) == 8 and len({job.key for job in cells}) == 8
    for job in cells:
        block = "normec_sn" if job.cfg.algo.server_norm else "normec_no_sn"
        row = param_label("beta", float(job.cfg.algo.beta))
        assert job.cfg.algo.gamma == paper_value("NORMEC-T2", block=block, row=row, column="gamma")
        assert (job.cfg.reading, job.cfg.eval_every, job.cfg.precision, job.cfg.profile) == ("pass", 1, "bf16", "paper")
    assert {job.cfg.algo.server_norm for job in cells} == {True, False}
    assert jobs.key(tuple(main_job.GPU)) in {job.key for job in cells}


def test_runs_side_by_side_are_as_many_as_finish_in_the_time_left(tmp_path, monkeypatch):
    """k runs side by side take 1 + 0.75 (k - 1) of one run's time: the step takes the first k that fit (at least
    one, and no more than the files a call hands back could carry stopped), never the main job's cell again, and
    hands the campaign exactly those, k at a time."""
    call = gr.Call(tmp_path / "out", tmp_path / "work", tmp_path / "store", 600, "paper", [], dry_run=True)
    given = []
    monkeypatch.setattr(call, "campaign", lambda name, todo, stack: given.append((name, todo, stack)))
    monkeypatch.setattr(call, "each", lambda: 180.0)
    others = [job.key for job in gr.best_cells("paper") if job.key != call.cell().key]
    for left, k in ((100, 1), (180, 1), (314, 1), (315, 2), (449, 2), (450, 3), (10_000, 7)):
        monkeypatch.setattr(call, "left", lambda left=left: left)
        call.t2_best()
        name, todo, stack = given.pop()
        assert name == "t2-best" and stack == k == len(todo), (left, k, stack)
        assert [job.key for job in todo] == others[:k] and call.cell().key not in others
    call.out.mkdir()                                     # 5 files handed back already: room for 2 runs (and the logs)
    for i in range(5):
        (call.out / f"part-{i}.tar.gz").touch()
    call.t2_best()
    assert given.pop()[2] == 2


def test_each_call_says_what_it_would_train_and_hands_back_its_logs(tmp_path, capsys):
    """A dry run of each call: its steps in order, the main job as `make run` runs it, into the cell's store
    folder; nothing trained; OUT holds logs.tar.gz with the call's summary."""
    for name, steps in gr.CALLS.items():
        out = tmp_path / name
        assert gr.main([str(out), "--call", name, "--dry-run", "--store", str(tmp_path / "store"),
                        "--work", str(tmp_path / f"work-{name}")]) == 0
        said = capsys.readouterr().out
        for step in steps:
            assert f"\n{step}: " in said, (name, step)
        assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz"]
        with tarfile.open(out / "logs.tar.gz") as tar:
            summary = tar.extractfile("summary.txt").read().decode()
        assert summary.splitlines()[0].startswith(f"gpu call '{name}'") and not (tmp_path / "store").exists()
        assert summary.splitlines()[-1].endswith("; handed back: logs.tar.gz")
        if name == "first":
            cell = jobs.key(tuple(main_job.GPU))
            assert f"main-job: {REPO / 'scripts' / 'main_job.py'} {tmp_path / 'store' / cell}\n" in said


SAVES_SLOWLY = """
import signal, sys, time
def stop(*_):
    time.sleep(1.0)                      # a checkpoint that takes a while to write
    open(sys.argv[1], "w").write("saved")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
print("training", flush=True)
time.sleep(60)
"""


def test_a_ctrl_c_to_make_run_lets_its_run_save_its_checkpoint(tmp_path):
    """A Ctrl-C reaches the main job and its run alike (a terminal's process group, or a device call's deadline):
    the main job waits for the run to save and stop, and exits with its code (subprocess.call killed the run
    0.25 s after the Ctrl-C)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "run.py").write_text(SAVES_SLOWLY)
    driver = (f"import sys; sys.path.insert(0, {str(REPO / 'scripts')!r}); import main_job, subprocess\n"
              "popen = subprocess.Popen\n"
              f"main_job.subprocess.Popen = lambda cmd, **kw: popen([sys.executable, {str(tmp_path / 'run.py')!r}, "
              f"{str(tmp_path / 'saved')!r}], **kw)\n"
              f"sys.exit(main_job.main(main_job.Path({str(tmp_path / 'run')!r}), []))\n")
    proc = subprocess.Popen([sys.executable, "-c", driver], process_group=0, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("main job:") and proc.stdout.readline() == "training\n"
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 130 and (tmp_path / "saved").read_text() == "saved"


def test_nfa_cells_start_with_one_run_then_as_many_as_their_timed_siblings_allow(tmp_path, monkeypatch):
    """No NFA CIFAR-10 run timed on this kind of device: one run (its time sizes the next call). Once a run has
    finished, its seed siblings' wall time sizes the rest (60 s and 200 s left: 4 side by side), seed by seed."""
    call = gr.Call(tmp_path / "out", tmp_path / "work", tmp_path / "store", 600, "paper", [], dry_run=True)
    given = []
    monkeypatch.setattr(call, "campaign", lambda name, todo, stack: given.append((name, todo, stack)))
    monkeypatch.setattr(call, "left", lambda: 200.0)
    call.nfa_cifar10()
    name, todo, stack = given.pop()
    assert name == "nfa-cifar10" and stack == len(todo) == 1 and todo[0].cfg.seed == 0
    done = todo[0].dir(call.store)
    done.mkdir(parents=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"                     # made on this kind of device
    (done / "summary.json").write_text(json.dumps({"status": "completed", "wall_time_s": 60.0, "device": device}))
    call.nfa_cifar10()
    name, todo, stack = given.pop()
    assert stack == len(todo) == 4 and done.name not in {job.key for job in todo}
    assert {job.cfg.seed for job in todo} == {0}


def test_a_signal_stops_the_call_after_its_step_and_still_hands_back_the_logs(tmp_path, monkeypatch, capsys):
    """A Ctrl-C or SIGTERM (a scheduler's, a device's time limit) during the main job: its run saves, the later
    steps do not start, and OUT still gets logs.tar.gz; the call exits 130."""
    import signal

    def signalled(stop, cmd, deadline, **kwargs):
        stop._handle(signal.SIGTERM, None)           # as the signal would, while the child trains
        return False

    monkeypatch.setattr(gr.store, "until", signalled)
    started = []
    monkeypatch.setattr(gr.Call, "t2_best", lambda self: started.append("t2-best"))
    out = tmp_path / "out"
    assert gr.main([str(out), "--call", "first", "--store", str(tmp_path / "store"), "--work", str(tmp_path / "work"),
                    "rounds=1"]) == 130
    with tarfile.open(out / "logs.tar.gz") as tar:
        summary = tar.extractfile("summary.txt").read().decode().splitlines()
    assert "main-job: stopped by a signal" in summary and "t2-best: not started, a signal stopped the call" in summary
    assert not started and sorted(p.name for p in out.iterdir()) == ["logs.tar.gz"]

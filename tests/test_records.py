"""The committed results store (``outputs/records``) and campaigns that fill it: records stay small and
true to their keys, a record is never overwritten, a campaign cut by its budget, adopted elsewhere and
continued there ends with the record an uninterrupted campaign makes, and Ctrl-C stops a driver cleanly."""

from __future__ import annotations

import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

import numpy as np
import pytest
from omegaconf import OmegaConf

import normfl.run.training
from normfl.config import config_key
from normfl.errors import ConfigError
from normfl.reproduce import campaign, jobs, records, verify
from normfl.reproduce import store as run_store
from normfl.reproduce.jobs import Job

BUDGET_PER_RUN, BUDGET_TOTAL = 20_000, 8_000_000          # bytes: the repository travels to GPU boxes


@pytest.mark.slow
def test_the_committed_records_are_small_and_true_to_their_keys():
    committed = jobs.ROOT / "outputs" / "records"
    recs = [d for d in committed.glob("*") if d.is_dir()] if committed.is_dir() else []
    sizes = [sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) for d in recs]
    assert sum(sizes) <= BUDGET_TOTAL and (not recs or sum(sizes) / len(recs) <= BUDGET_PER_RUN)
    for d in recs:
        assert sorted(p.name for p in d.iterdir()) == sorted(records.FILES), d
        assert config_key(OmegaConf.load(d / "config.yaml")) == d.name
        summary = json.loads((d / "summary.json").read_text())
        assert summary["config_key"] == d.name and summary["status"] in ("completed", "diverged")


def test_an_ali_dpfl_record_is_the_same_run_as_one_that_now_reports_a_claim():
    """ALI-DPFL records with R_s < R_c were made before their runs said ``privacy.not_certified`` and counted
    ``privacy.tau_infeasible_rounds``: fields added to the block since are not compared, by packing or verify."""
    committed = sorted((jobs.ROOT / "outputs" / "records").glob("ali_dpfl-*"))
    rec = next(d for d in committed if (p := json.loads((d / "summary.json").read_text())["privacy"])["R_s"] < p["R_c"])
    files = records.contents(rec)
    s = json.loads(files["summary.json"])
    assert "not_certified" not in s["privacy"]
    now = {**s, "privacy": {**s["privacy"], "not_certified": ["ALI-DPFL chooses each round's τ ..."],
                            "tau_infeasible_rounds": 7}}
    fresh = {**files, "summary.json": json.dumps(now).encode()}
    assert records.differences(files, fresh) == [] and verify.identical(verify.compare(files, fresh))


def job(data_root, *extra) -> Job:
    overrides = ["algo=normec", "dataset=fashion_mnist", "dataset.train_limit=200", "dataset.test_limit=100",
                 "model=logreg", "clients=2", "eval_every=500", "checkpoint_every=0", f"data_root={data_root}",
                 *extra]
    cfg = jobs.compose(tuple(overrides))
    return Job({}, overrides, config_key(cfg), cfg)


LONG = ("rounds=2000", "eval_every=250")     # 8 evaluations: a stop once 3 are logged lands mid-run


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """A clone's records and store, as folders of their own (``clone(name)`` switches to that clone)."""
    def switch(name: str):
        monkeypatch.setattr(records, "RECORDS", tmp_path / name / "records")
        return tmp_path / name / "store"
    return switch


@pytest.mark.slow
def test_a_run_is_packed_once_and_a_differing_record_is_refused(clone, data_root, tmp_path):
    store = clone("a")
    j = job(data_root, "rounds=5")
    assert campaign.run([j], store, 300, threads=1, out=tmp_path / "a.tar.gz") == [tmp_path / "a.tar.gz"]
    rec = records.RECORDS / j.key
    assert sorted(p.name for p in rec.iterdir()) == sorted(records.FILES)
    assert records.pack(store / j.key) == "same"
    other = tmp_path / "other"
    shutil.copytree(rec, other)
    rows = lzma.decompress((other / "metrics.csv.xz").read_bytes()).decode().replace(",0.", ",1.", 1)
    (other / "metrics.csv.xz").write_bytes(lzma.compress(rows.encode()))
    with pytest.raises(records.RecordError, match="differ in metrics.csv.xz"):
        records.pack(other)
    summary = json.loads((other / "summary.json").read_text())
    (other / "summary.json").write_text(json.dumps({**summary, "config_key": "normec-000000000000"}))
    with pytest.raises(records.RecordError, match="a summary of its config"):
        records.pack(other)
    assert (rec / "metrics.csv.xz").read_bytes() != (other / "metrics.csv.xz").read_bytes()   # never overwritten


@pytest.mark.slow
def test_a_campaign_plans_by_the_wall_times_of_its_grids_finished_runs(clone, data_root, tmp_path):
    store = clone("a")
    done = job(data_root, "rounds=5", "seed=0")
    campaign.run([done], store, 300, threads=1, out=tmp_path / "a.tar.gz")
    wall = json.loads((records.RECORDS / done.key / "summary.json").read_text())["wall_time_s"]
    todo = [job(data_root, "rounds=5", f"seed={s}") for s in (1, 2, 3)]
    unknown = job(data_root, "rounds=6", "seed=1")                  # another grid point: no finished sibling
    assert campaign.expected([done, *todo, unknown], store, "cpu") == {j.key: wall for j in (done, *todo)}
    assert campaign.expected([done, *todo], store, "cuda") == {}     # times on another kind of device say nothing
    lines = []
    campaign.run([done, *todo], store, 2.5 * wall / (1 - campaign.GRACE), parallel=1, dry_run=True, log=lines.append)
    assert lines[1].endswith(f"[~{wall:.0f} s]") and lines[-1].startswith("  about 2 of them fit")
    lines = []
    campaign.run([done, *todo, unknown], store, 60, dry_run=True, log=lines.append)
    assert not any("fit the budget" in line for line in lines)       # no count where a time is unknown
    assert [campaign.fitting([10, 10, 10], n, 20) for n in (1, 2, 3)] == [2, 3, 3]


def test_a_campaign_says_each_run_s_end_when_it_comes_not_in_the_plan_s_order(clone, data_root, monkeypatch):
    """Two at a time: the second run ends while the first still trains, and its line (and record) comes then."""
    store = clone("a")
    slow, fast = job(data_root, "rounds=5", "seed=0"), job(data_root, "rounds=5", "seed=1")
    fast_said = threading.Event()

    def train(unit, *_):
        if unit[0] is slow:
            fast_said.wait(timeout=10)                 # the old order kept the fast run's line until this ended
        return ["stopped"]

    def log(text):
        lines.append(text)
        if text.startswith("  stopped") and text.endswith(fast.key):
            fast_said.set()

    lines = []
    monkeypatch.setattr(campaign, "train", train)
    campaign.run([slow, fast], store, 300, parallel=2, log=log)
    ends = [line.split()[-1] for line in lines if line.startswith("  stopped")]
    assert ends == [fast.key, slow.key]


@pytest.mark.slow
def test_verify_trains_a_record_again_and_says_how_far_it_comes_out(clone, data_root, tmp_path, monkeypatch):
    store, scratch = clone("a"), tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    j = job(data_root, "rounds=5", "eval_every=1")
    campaign.run([j], store, 300, threads=1, out=tmp_path / "a.tar.gz")
    lines, used = [], []
    train = normfl.run.training.run
    monkeypatch.setattr(normfl.run.training, "run", lambda cfg, d: used.append(cfg.threads) or train(cfg, d))
    assert verify.verify(verify.record_dirs([j.key], "paper"), log=lines.append) == 0
    assert lines[-1].startswith(j.key) and lines[-1].endswith("): identical (every number but wall time)")
    assert used == [1]                              # the record's thread count (--threads: another)
    rec = records.RECORDS / j.key
    files = records.contents(rec)                   # a diverged run's NaN equals itself
    files["summary.json"] = json.dumps({**json.loads(files["summary.json"]), "final_train_loss": float("nan")})
    assert verify.identical(verify.compare(files, files)) and records.differences(files, files) == []
    older = {**files, "config.yaml": b"\n".join(line for line in files["config.yaml"].splitlines()
                                                 if not line.startswith((b"memory_format:", b"threads:")))}
    assert records.differences(older, files) == []  # made before memory_format existed, on other threads
    block = {"noise_multiplier": 1.0, "epsilon_pld": float("nan")}   # a field added to a block since: not compared
    assert records.same(block, {**block, "not_certified": ["why"]}) and not records.same({**block, "x": 1}, block)
    # a record that says otherwise: one accuracy, one loss
    rows = [r.split(",") for r in lzma.decompress((rec / "metrics.csv.xz").read_bytes()).decode().splitlines()]
    acc, loss = rows[0].index("test_acc"), rows[0].index("test_loss")
    rows[2][acc], rows[3][loss] = f"{float(rows[2][acc]) + 0.03:.9g}", f"{float(rows[3][loss]) * 1.001:.9g}"
    (rec / "metrics.csv.xz").write_bytes(lzma.compress(("\n".join(map(",".join, rows)) + "\n").encode()))
    summary = json.loads((rec / "summary.json").read_text())
    (rec / "summary.json").write_text(json.dumps({**summary, "device_name": "another CPU"}))
    lines = []
    assert verify.verify([rec], threads=1, log=lines.append) == 1
    assert "test accuracy by at most 3.00 pt at 1 of 6 evaluations" in lines[-1]
    assert "other numbers by at most 1.0e-03 relative (test_loss)" in lines[-1]
    torch_version = summary["versions"]["torch"]
    assert (f"recorded on another CPU, torch {torch_version}, 1 thread, now on {summary['device_name']}, "
            f"torch {torch_version}, 1 thread") in lines[-1]
    with pytest.raises(ConfigError, match="a record's key"):
        verify.record_dirs(["normec-000000000000"], "paper")
    assert list(scratch.iterdir()) == []                                 # the runs made again are gone
    verify.verify([records.RECORDS / j.key], threads=2, log=lines.append)
    assert used[-1] == 2 and "1 thread, now on" in lines[-1] and ", 2 threads" in lines[-1]


@pytest.mark.slow
@pytest.mark.parametrize("stack", [1, 2])
def test_a_campaign_cut_by_its_budget_continues_elsewhere_to_the_same_record(stack, clone, data_root, tmp_path,
                                                                            monkeypatch):
    """One run in its process, or (stack=2) two side by side in one process, cut, carried and continued."""
    js = [job(data_root, *LONG), job(data_root, *LONG, "algo.beta=0.5")][:stack]
    j = js[0]
    store = clone("whole")                                           # one uninterrupted campaign
    campaign.run(js, store, 600, threads=1, out=tmp_path / "whole.tar.gz", stack=stack)
    whole = [records.RECORDS / i.key for i in js]

    class CutMidRun(subprocess.Popen):
        """The budget runs out once the run has logged 3 evaluations of its 8 (whatever this machine's
        speed): the campaign's own timeout path then sends its Ctrl-C."""
        def wait(self, timeout=None):
            if timeout is None:
                return super().wait()
            metrics = j.dir(store) / "metrics.csv"
            while self.poll() is None and (not metrics.exists() or len(metrics.read_text().splitlines()) < 4):
                time.sleep(0.005)
            raise subprocess.TimeoutExpired(self.args, timeout)

    store = clone("a")                                               # a budget that stops the runs part-way
    with monkeypatch.context() as m:
        m.setattr(subprocess, "Popen", CutMidRun)
        [archive] = campaign.run(js, store, 600, threads=1, checkpoints=True, out=tmp_path / "a.tar.gz", stack=stack)
    for i in js:
        assert not (records.RECORDS / i.key).exists()
        assert f"store/{i.key}/checkpoint.pt" in tarfile.open(archive).getnames()
    if stack > 1:                                                    # the process's output, in each run's folder
        assert (js[1].dir(store) / "stdout.txt").read_text() == (j.dir(store) / "stdout.txt").read_text() != ""

    store = clone("b")                                               # adopted into another clone, continued
    assert campaign.adopt(archive, store) == 0 and (store / j.key / "checkpoint.pt").exists()
    assert campaign.adopt(archive, store) == 0                       # adopting twice changes nothing
    [final] = campaign.run(js, store, 600, threads=1, out=tmp_path / "b.tar.gz", stack=stack)
    for i, w in zip(js, whole, strict=True):
        assert records.differences(records.contents(w), records.contents(records.RECORDS / i.key)) == []
    assert campaign.adopt(final, store) == 0                         # its own record again: the same

    bad = tmp_path / "bad"                                           # a record that differs is refused
    with tarfile.open(final) as tar:
        tar.extractall(bad, filter="data")
    m = bad / "records" / j.key / "metrics.csv.xz"
    m.write_bytes(lzma.compress(lzma.decompress(m.read_bytes()).replace(b",0.", b",2.", 1)))
    with tarfile.open(tmp_path / "bad.tar.gz", "w:gz") as tar:
        tar.add(bad / "records", arcname="records")
    assert campaign.adopt(tmp_path / "bad.tar.gz", store) == 1
    assert records.differences(records.contents(whole[0]), records.contents(records.RECORDS / j.key)) == []


def test_an_archive_over_the_limit_comes_in_parts_and_a_checkpoint_too_big_is_named(clone, tmp_path, monkeypatch):
    """A GPU box hands back files of at most ARCHIVE_MAX: records first, then checkpoints fill parts of at most
    that size (a.tar.gz, a-2.tar.gz, ...); a checkpoint bigger than a part is left out and said so; adopting
    the parts brings every checkpoint over."""
    monkeypatch.setattr(campaign, "ARCHIVE_MAX", 64 * 2**10)
    rng = np.random.default_rng(0)
    store = clone("gpu")
    done = [Job({}, [], f"normec-rec{i}", None) for i in range(3)]
    for j in done:
        records.RECORDS.joinpath(j.key).mkdir(parents=True)
        (records.RECORDS / j.key / "summary.json").write_bytes(rng.bytes(1000))
    sizes = (40, 40, 100, 16)                                         # KiB
    stopped = [Job({}, [], f"normec-ckpt{i}", None) for i in range(len(sizes))]
    for j, kib in zip(stopped, sizes, strict=True):
        (j.dir(store) / ".hydra").mkdir(parents=True)
        (j.dir(store) / "checkpoint.pt").write_bytes(rng.bytes(kib << 10))      # weights do not compress
        (j.dir(store) / ".hydra" / "config.yaml").write_text("seed: 0\n")
    lines = []
    paths = campaign.archive(done, stopped, store, tmp_path / "a.tar.gz", log=lines.append)
    assert paths == [tmp_path / "a.tar.gz", tmp_path / "a-2.tar.gz"]
    assert all(p.stat().st_size <= campaign.ARCHIVE_MAX for p in paths)
    names = [tarfile.open(p).getnames() for p in paths]
    assert [n for n in names[0] if n.count("/") == 1] == [f"records/{j.key}" for j in done]
    assert [n for n in names[0] if n.endswith(".pt")] == ["store/normec-ckpt0/checkpoint.pt"]
    assert [n for n in names[1] if n.endswith(".pt")] == [f"store/normec-ckpt{i}/checkpoint.pt" for i in (1, 3)]
    assert len(lines) == 1 and "store/normec-ckpt2/checkpoint.pt: 0.1 MiB" in lines[0]
    assert campaign.parts_there(tmp_path / "a.tar.gz") == [tmp_path / "a-2.tar.gz", tmp_path / "a.tar.gz"]
    assert campaign.archive([], [], store, tmp_path / "none.tar.gz") == []

    home = clone("home")                                    # (the stand-in records are refused: not real ones)
    assert sum(campaign.adopt(p, home, log=lines.append) for p in paths) == len(done)
    assert sorted(d.name for d in home.iterdir()) == ["normec-ckpt0", "normec-ckpt1", "normec-ckpt3"]


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["run", "campaign"])
def test_ctrl_c_stops_a_driver_its_runs_checkpointed_none_failed_and_none_started_after(driver, clone, data_root,
                                                                                         tmp_path):
    """Ctrl-C to ``run`` (``make <id>``) or ``campaign`` while its first run trains: that run saves a checkpoint
    (so it got one Ctrl-C, not the terminal's and the driver's both), is not marked failed, and the second
    never starts; the driver ends with KeyboardInterrupt (exit 130), and the same command finishes both."""
    store = clone("a")
    js = [job(data_root, *LONG, f"seed={s}") for s in (0, 1)]
    metrics = js[0].dir(store) / "metrics.csv"

    def press():                                        # once the first run has logged 3 evaluations of its 8
        while not metrics.exists() or len(metrics.read_text().splitlines()) < 4:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    def drive(out):
        if driver == "run":
            return run_store.run_missing(js, store, threads=1)
        return campaign.run(js, store, 600, threads=1, checkpoints=True, out=out)

    threading.Thread(target=press, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        drive(tmp_path / "a.tar.gz")
    assert (js[0].dir(store) / "checkpoint.pt").exists() and run_store.status(js[0].dir(store)) == "missing"
    assert not js[1].dir(store).exists() and not (records.RECORDS / js[0].key).exists()
    if driver == "campaign":
        assert tarfile.open(tmp_path / "a.tar.gz").getnames() == [f"store/{js[0].key}/checkpoint.pt",
                                                                   f"store/{js[0].key}/.hydra/config.yaml"]
    drive(tmp_path / "b.tar.gz")
    assert [run_store.status(records.locate(j.key, store)) for j in js] == ["completed"] * 2
    assert "resuming from round" in (js[0].dir(store) / "stdout.txt").read_text()


def test_stop_passes_each_signal_on_once_and_starts_nothing_after(tmp_path):
    """``store.Stop``: every Ctrl-C or SIGTERM to the driver reaches each child, and each process a child
    started (a joblib sweep's workers), as exactly one SIGINT (the first asks for a checkpoint, the second stops
    at once), and no child starts once a stop is asked."""
    got, worker_got = tmp_path / "got", tmp_path / "worker"
    head = "import os, signal, subprocess, sys, time\n"
    record = ("signal.signal(signal.SIGINT, lambda *a: open(sys.argv[1], 'a').write('INT\\n'))\n"
              "open(sys.argv[1] + '.ready', 'w').close()\n"
              "while not os.path.exists(sys.argv[1]) or len(open(sys.argv[1]).read().split()) < 2:\n"
              "    time.sleep(0.01)\n")
    worker = head + record
    child = (head + f"w = subprocess.Popen([sys.executable, '-c', {worker!r}, {str(worker_got)!r}])\n"  # its worker
             f"while not os.path.exists({str(worker_got) + '.ready'!r}):\n    time.sleep(0.01)\n"
             + record + "w.wait()\n")

    def lines(path=got) -> int:
        return len(path.read_text().split()) if path.exists() else 0

    def until(ok) -> None:
        for _ in range(6000):
            if ok():
                return
            time.sleep(0.01)

    before = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    with run_store.Stop() as stop:
        proc = stop.popen([sys.executable, "-c", child, str(got)])
        try:
            until((tmp_path / "got.ready").exists)
            os.kill(os.getpid(), signal.SIGINT)
            until(lambda: lines() == lines(worker_got) == 1)     # two in flight at once would arrive as one
            os.kill(os.getpid(), signal.SIGTERM)
            assert proc.wait(timeout=60) == 0 and got.read_text().split() == ["INT", "INT"]
            assert worker_got.read_text().split() == ["INT", "INT"]
        finally:
            if proc.poll() is None:              # a failing check leaves no child or worker behind
                os.killpg(proc.pid, signal.SIGKILL)
        assert stop.count == 2 and stop.popen([sys.executable, "-c", ""]) is None
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == before    # the driver's own are back


def test_a_record_folder_without_its_summary_is_refused_not_recursed_into(tmp_path, monkeypatch):
    """A record folder holding no summary.json made the atomic rename fail and pack call itself for ever."""
    source = next(d for d in sorted((jobs.ROOT / "outputs" / "records").iterdir()) if (d / "summary.json").is_file())
    monkeypatch.setattr(records, "RECORDS", tmp_path / "records")
    (tmp_path / "records" / source.name).mkdir(parents=True)
    (tmp_path / "records" / source.name / "config.yaml").write_bytes((source / "config.yaml").read_bytes())
    with pytest.raises(records.RecordError, match="holds no summary.json"):
        records.pack(source)
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == [source.name]   # nothing else left there


def test_a_record_is_trained_again_in_the_memory_layout_it_was_made_with():
    """memory_format came after 108 of the records, which laid their convolutions' activations out as the model
    made them; its default, auto, lays them channels-last on a CPU, which rounds differently (dpfl-f7a73795a444
    came out 0.02 pt apart that way, identical in its own layout). A record made since keeps its own; another key
    added since takes its default."""
    from normfl.config.keys import root

    made = OmegaConf.create(OmegaConf.to_container(jobs.compose(          # as a record's config.yaml is read
        ("algo=dpfl", "model=cnn", "memory_format=channels_last", "capture=off"))))
    older = OmegaConf.create({k: v for k, v in made.items() if k not in ("memory_format", "capture")})
    assert verify.today(made).memory_format == "channels_last" and verify.today(made).capture == "off"
    assert verify.today(older).memory_format == "contiguous" and verify.today(older).capture == root().capture

"""``logger=wandb``: a sweep's runs, trained side by side, each an offline W&B run of its own with the name, group,
tags and notes a user expects, its config and its per-round metrics; W&B's keys checked before any work and kept
out of a run's key.

The runs are read back from their transaction logs (``<run dir>/wandb/offline-run-*/run-<id>.wandb``): wandb 0.31
writes no ``files/config.yaml``, ``wandb-summary.json`` or ``wandb-metadata.json`` offline and ships no reader of
the log, so ``records`` reads it here. The file is W&B's 7-byte header (``:W&B``, a magic number, a version) and
then LevelDB's log format (32 KiB blocks of chunks, each a 7-byte header: CRC, length, type), each record one
``wandb_internal_pb2.Record``, wandb's own protobuf, the schema ``wandb sync`` uploads."""

import json
import os
import struct

import pandas as pd
import pytest
from omegaconf import OmegaConf

from normfl.config import config_key
from normfl.run.sweep import wandb_names
from tests.helpers import composed, config, ended, refused, train, trained

BLOCK, CHUNK_HEADER, FILE_HEADER = 32768, 7, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
BETAS = ("0.01", "0.1")


def records(path) -> list:
    """The records of a W&B transaction log, in order."""
    from wandb.proto import wandb_internal_pb2

    data, pos, parts, out = path.read_bytes(), FILE_HEADER, b"", []
    assert data[:4] == b":W&B", data[:FILE_HEADER]
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:            # a block's tail too short for a header: padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        if kind == 0:                                      # zeros to the block's end
            pos += BLOCK - pos % BLOCK
            continue
        parts += data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
            parts = b""
    return out


def items(updates) -> dict:
    """Config, history or summary items as a dict of their (dotted) keys' values."""
    return {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in updates}


def offline_run(job_dir) -> dict:
    """The one offline W&B run in a run directory: its run record, config, history rows by step, summary, exit."""
    logs = list(job_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 1, logs
    return offline_log(logs[0])


def offline_log(log) -> dict:
    """One offline W&B run's transaction log: its run record, config, history rows by step, summary, exit."""
    run = {"config": {}, "history": {}, "summary": {}, "exit": None}
    for r in records(log):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run["run"] = r.run
            run["config"].update(items(r.run.config.update))
        elif kind == "config":
            run["config"].update(items(r.config.update))
        elif kind == "history":
            row = items(r.history.item)
            run["history"][row["_step"]] = row
        elif kind == "summary":
            run["summary"].update(items(r.summary.update))
        elif kind == "exit":
            run["exit"] = r.exit
    return run


@pytest.fixture(scope="module")
def wandb_env(tmp_path_factory) -> dict:
    """This process's environment, offline, with wandb's own folders under a temporary one (nothing written in
    the home directory) and no W&B setting of the user's."""
    home = tmp_path_factory.mktemp("wandb_home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    folders = {"WANDB_DIR": "runs", "WANDB_CONFIG_DIR": "config", "WANDB_CACHE_DIR": "cache", "WANDB_DATA_DIR": "data",
               "WANDB_ARTIFACT_DIR": "artifacts"}
    return env | {"WANDB_MODE": "offline", "WANDB_SILENT": "true"} | {k: str(home / v) for k, v in folders.items()}


@pytest.fixture(scope="module")
def grid(tmp_path_factory, data_root, wandb_env):
    """Two runs, β = 0.01 and 0.1, trained side by side (``hydra/launcher=stacked``) in the sweep folder grid1."""
    out = tmp_path_factory.mktemp("sweep") / "grid1"
    train(data_root, "logger=wandb", "logger.tags=[fmnist,tiny]", "logger.notes=two betas", "algo=normec",
          "dataset=fashion_mnist", "dataset.train_limit=600", "dataset.test_limit=200", "model=logreg", "rounds=3",
          "clients=3", f"algo.beta={','.join(BETAS)}", "progress=false", "hydra/launcher=stacked",
          f"hydra.sweep.dir={out}", "hydra.sweep.subdir=${hydra.job.num}", multirun=True, timeout=300,
          env=wandb_env)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("job", [0, 1])
def test_each_run_of_a_sweep_is_its_own_wandb_run_named_by_its_swept_values(grid, job):
    run = offline_run(grid / str(job))
    assert run["run"].display_name == f"algo.beta={BETAS[job]}"        # what the sweep varies, nothing else
    assert run["run"].run_group == "grid1"                             # the sweep's folder
    assert list(run["run"].tags) == ["fmnist", "tiny"] and run["run"].notes == "two betas"
    assert run["exit"] is not None and run["exit"].exit_code == 0      # finished, not left open by its neighbour
    recorded = OmegaConf.to_container(OmegaConf.load(grid / str(job) / ".hydra" / "config.yaml"), resolve=True)
    assert {k: run["config"][k] for k in recorded} == recorded


@pytest.mark.slow
@pytest.mark.parametrize("job", [0, 1])
def test_each_wandb_run_holds_its_runs_rounds_and_summary(grid, job):
    run = offline_run(grid / str(job))
    metrics = pd.read_csv(grid / str(job) / "metrics.csv")
    assert sorted(run["history"]) == list(metrics["round"]) == [0, 1, 2, 3]
    for _, row in metrics.iterrows():
        logged = run["history"][row["round"]]
        assert logged["test_acc"] == pytest.approx(row["test_acc"])
        assert logged["transmissions_total"] == row["transmissions_total"]
    summary = json.loads((grid / str(job) / "summary.json").read_text())
    assert run["summary"]["status"] == "completed" and run["summary"]["config_key"] == summary["config_key"]
    assert run["summary"]["final_test_acc"] == pytest.approx(summary["final_test_acc"])


def test_a_single_runs_name_is_its_overrides_that_change_its_key_and_its_group_the_experiment():
    hydra = {"mode": "RUN", "sweep": {"dir": "outputs/multirun/x"}, "runtime": {"choices": {"experiment": None}},
             "overrides": {"task": ["logger=wandb", "algo.beta=0.1", "progress=false", "rounds=5"]}}
    assert wandb_names(OmegaConf.create({"hydra": hydra})) == {"name": "algo.beta=0.1,rounds=5", "group": None}
    hydra["runtime"]["choices"]["experiment"] = "quick_fmnist"
    hydra["overrides"]["task"] = ["logger=wandb", "experiment=quick_fmnist"]
    assert wandb_names(OmegaConf.create({"hydra": hydra})) == {"name": "experiment=quick_fmnist",
                                                               "group": "quick_fmnist"}
    assert wandb_names(None) == {}                                     # no Hydra (a run built in code): wandb's own


def test_wandb_keys_leave_a_runs_key_as_it_is():
    base = ["dataset=fashion_mnist", "model=logreg"]
    keys = {config_key(composed(*base, *extra)) for extra in (
        [], ["logger=wandb"], ["logger=wandb", "logger.group=g", "logger.tags=[a]", "logger.notes=n"])}
    assert len(keys) == 1, keys


@pytest.mark.parametrize("overrides, expect", [
    (["logger.tags=5"], "logger.tags=5; allowed: a list of strings of 1 to 64 characters"),
    (["logger.tags=[ok,7]"], "logger.tags=['ok', 7]; allowed: a list of strings"),
    (["logger.tags=[" + "x" * 65 + "]"], "allowed: a list of strings of 1 to 64 characters"),
    (["logger.group=[a]"], "logger.group=['a']; allowed: null or a string"),
    (["logger.notes=3"], "logger.notes=3; allowed: null or a string"),
], ids=["tags not a list", "a tag not a string", "a tag too long", "group a list", "notes a number"])
def test_bad_wandb_values_are_refused_naming_the_key(overrides, expect, tmp_path, data_root):
    refused(tmp_path, data_root, ["logger=wandb", "logger.mode=disabled", *overrides], expect)


def test_a_wandb_key_under_the_csv_logger_is_refused(tmp_path, data_root):
    """Nothing would read it: refused with the csv logger's keys, as any key nothing reads is."""
    refused(tmp_path, data_root, ["logger.group=grid1"], "logger.group=grid1; allowed: the keys of logger=csv: name")


@pytest.mark.slow
def test_a_resumed_run_goes_on_in_its_wandb_run_and_a_failed_one_ends_failed_at_once(tmp_path, data_root, wandb_env,
                                                                                    monkeypatch):
    """A run stopped with a checkpoint and resumed logs its later rounds under the W&B run id of its first start
    (online the same W&B run goes on; offline the two parts share the id, and ``wandb sync`` uploads them in
    order as one run), every round once. A run that fails ends its W&B run then, with exit code 1, not at the process's
    exit (a sweep's next jobs train in the same process meanwhile)."""
    import time

    from normfl.run import start, together, training

    for k in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(k)
    for k, v in wandb_env.items():
        if k.startswith("WANDB_"):
            monkeypatch.setenv(k, v)
    cfg = config(data_root, "logger=wandb", "algo=normec", "rounds=6", "eval_every=1", "checkpoint_every=0")
    run_dir = tmp_path / "run"
    t = trained(start(cfg, run_dir), until_step=3)
    t.save()                                          # a Ctrl-C's checkpoint, then the process ends:
    t.rec.close(130)
    t.rundir.release()
    time.sleep(1.1)                                   # (a part's folder is named by the second it starts in)
    ended(trained(start(cfg, run_dir)))
    parts = [offline_log(log) for log in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))]
    assert len(parts) == 2 and parts[0]["run"].run_id == parts[1]["run"].run_id
    assert sorted(parts[0]["history"]) == [0, 1, 2, 3] and sorted(parts[1]["history"]) == [4, 5, 6]
    assert parts[1]["exit"].exit_code == 0 and parts[1]["summary"]["status"] == "completed"

    def failing(algo, clients):
        def round_(*args):
            raise RuntimeError("a round that fails")
        return round_

    monkeypatch.setattr(training, "round_of", failing)
    with pytest.raises(RuntimeError, match="a round that fails"):
        training.run(cfg, tmp_path / "failed")
    started = together.start                          # and a run of a sweep trained side by side (one process)

    def failing_beside(*args, **kw):
        t = started(*args, **kw)
        t.algo.round = failing(None, None)
        return t

    monkeypatch.setattr(together, "start", failing_beside)
    assert together.train_together([(cfg, tmp_path / "failed beside")])[0]["status"] == "failed"
    for failed in (offline_run(tmp_path / "failed"), offline_run(tmp_path / "failed beside")):
        assert failed["exit"] is not None and failed["exit"].exit_code == 1
        assert failed["run"].run_id != parts[0]["run"].run_id

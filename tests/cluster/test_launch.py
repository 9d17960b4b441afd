"""``make <id> launcher=slurm`` (``python -m normfl.reproduce run ID --launcher slurm``): the ID's missing runs, from
every block of its grid, in one job array; a finished run given no job; each finished run recorded, as ``make <id>``
records it; the exit status non-zero when a run was refused or failed."""

from __future__ import annotations

import json

import pytest

from normfl.reproduce import __main__ as driver
from normfl.reproduce import jobs, records

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_an_ids_runs_go_in_one_job_array_recorded_and_a_refused_one_fails_the_command(slurm, tmp_path, monkeypatch,
                                                                                      capfd):
    base = [*slurm.RUN, "rounds=20", "eval_every=10", f"data_root={slurm.data_root}"]
    blocks = [["algo.beta=0.01"], ["algo.beta=0.1"], ["algo=clip21", "algo.gamma=O.01"]]   # the last: refused
    grid = [jobs.Job({}, [*base, *b], jobs.key((*base, *b))) for b in blocks]
    monkeypatch.setattr(driver, "grid_jobs", lambda args, ids: {ids[0].id: grid})
    monkeypatch.setattr(driver, "draw", lambda ids, args: None)                       # the figures are not the point
    store = tmp_path / "store"
    command = ["run", "normec-t2", "--launcher", "slurm", "--store", str(store), "hydra.launcher.cpus_per_task=1",
               "hydra.launcher.mem_gb=1", "threads=1"]
    with pytest.raises(SystemExit) as ended:
        driver.main(command)
    out, err = capfd.readouterr()
    assert "1 run(s) did not finish" in str(ended.value.code), (out, err[-3000:])
    assert "3 runs, 0 already stored, 3 to run" in out and "Traceback" not in err
    assert "refused (algo=clip21 algo.gamma=O.01): invalid config: algo.gamma='O.01'" in err, err[-3000:]
    (launch,) = (tmp_path / "launches" / "normec-t2").iterdir()
    states = slurm.states(slurm.array(launch))                       # all three runs: one job array
    assert sorted(states.values()) == ["COMPLETED", "COMPLETED", "FAILED"], states
    for run in grid[:2]:                                             # finished: in the store, and recorded
        assert json.loads((store / run.key / "summary.json").read_text())["status"] == "completed"
        assert f"record added {run.key}" in out and (records.RECORDS / run.key / "metrics.csv.xz").is_file()

    monkeypatch.setattr(driver, "grid_jobs", lambda args, ids: {ids[0].id: grid[:2]})
    driver.main(command)                                            # the finished runs again: no job, exit 0
    out, err = capfd.readouterr()
    assert "2 runs, 2 already stored, 0 to run" in out and len(list(launch.parent.iterdir())) == 1

"""The run store: every run of a figure or table lives in ``outputs/store/<key>``, where the key is a
hash of its resolved config, so a grid re-run only trains what is missing and runs shared between
figures (NORMEC's NP-SN group feeds five of them) are trained once.

An experiment file ``conf/experiment/<name>.yaml`` may carry two inert nodes that training ignores:

``grid``
    The paper's runs: a list of blocks whose union is the grid. A block names ``experiment``, a
    list of experiment files (a paper's run group, e.g. ``normec_np_nosn``; default: this file),
    and lists of values for config groups (``algo: [dpfl]``) or dotted keys (``algo.tau: [1, 2]``).
    Its runs are the product of those lists and of the experiment file's own Hydra sweep
    (``hydra.sweeper.params``, what ``train.py -m experiment=<file>`` runs); a list in the block
    replaces the sweep's list for the same key.
``paper`` / ``text`` / ``quick``
    The profiles: ``set``, the overrides that scale a run (kept with the run group or its setup
    file, e.g. ``nfa_fmnist.yaml``, so every figure drawing on a run group runs it alike; an ID
    file may add its own), and, for ``quick``, ``grid``: lists that replace the lists of the
    same key in every block (fewer grid points and seeds). ``text`` exists only where a run group
    defines it: the NORMEC and FEDNORMEC IDs, whose paper profile reads a round as a pass and whose
    text profile keeps the literal reading (``normec_setup.yaml``).
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from normfl import checkpoint
from normfl.config import GRID_PROFILES as PROFILES
from normfl.config import config_key
from normfl.errors import ConfigError
from normfl.results import FINISHED

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def value_text(v) -> str:
    """A grid value as a Hydra override writes it."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(value_text(x) for x in v) + "]"
    return "null" if v is None else str(v)


@dataclass
class Job:
    params: dict                       # the grid point: key -> value (incl. experiment/groups)
    overrides: list[str]               # what train.py is given
    key: str                           # the store folder: config_key of the resolved config
    cfg: DictConfig | None = field(default=None, repr=False)

    def dir(self, store: Path) -> Path:
        return store / self.key

    def command(self) -> str:
        return "python train.py " + " ".join(self.overrides)


def load_experiment(name: str) -> DictConfig:
    path = CONF / "experiment" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
        raise ConfigError("experiment", name, " | ".join(known))
    return OmegaConf.load(path)


def grid_points(name: str, profile: str) -> list[dict]:
    """The grid points of an experiment file under a profile, in file order."""
    if profile not in PROFILES:
        raise ConfigError("profile", profile, " | ".join(PROFILES))
    spec = load_experiment(name)
    blocks = OmegaConf.to_container(spec.get("grid") or [{}], resolve=False)
    values = OmegaConf.select(spec, f"{profile}.grid", default=None) if profile != "paper" else None
    replace = OmegaConf.to_container(values) if values is not None else {}   # the profile's values in every block
    points = []
    for block in blocks:
        for experiment in replace.get("experiment", block.get("experiment", [name])):
            lists = {**sweep(experiment), **{k: v for k, v in block.items() if k != "experiment"}}
            lists = {k: replace.get(k, v) for k, v in lists.items()}
            for values in itertools.product(*lists.values()):
                points.append({"experiment": experiment, **dict(zip(lists, values, strict=True))})
    return points


def sweep(name: str) -> dict[str, list]:
    """An experiment file's Hydra sweep (``hydra.sweeper.params``) as lists of values."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(load_experiment(name), "hydra.sweeper.params", default=None) or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return {o.key_or_group: list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()] for o in parsed}


def _settings(cfg: DictConfig, profile: str) -> dict:
    node = OmegaConf.select(cfg, f"{profile}.set", default=None)
    return OmegaConf.to_container(node, resolve=False) if node is not None else {}


OPTIONAL_PROFILES = {  # profiles only some run groups define, and what they read differently from the paper's
    "text": "a round read literally, one minibatch step per client; spec A2",
    "code": "the ALI-DPFL authors' code as it runs: experiment=alidpfl_authors_code, their split, divisor 64 "
            "and 20% test subsets; Fashion-MNIST only",
}


def has_profile(name: str, profile: str) -> bool:
    """Whether an experiment's grid can run under ``profile`` (an optional one: its run groups define it)."""
    if profile not in OPTIONAL_PROFILES:
        return profile in PROFILES
    groups = {point["experiment"] for point in grid_points(name, profile)}
    return all(OmegaConf.select(compose((f"experiment={g}",)), profile) is not None for g in groups)


@functools.cache
def compose(overrides: tuple[str, ...]) -> DictConfig:
    """The root config with these overrides (composed once per process: figures share runs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):   # leaves Hydra as it found it
        return hydra_compose(config_name="config", overrides=list(overrides))


@functools.cache
def jobs(name: str, profile: str) -> list[Job]:
    """Every run of an experiment's grid, with its resolved config and store key.

    A run's profile settings are its run group's (``paper.set`` / ``quick.set`` in the experiment
    file it is composed from, or in that file's defaults), then the ID file's own."""
    if not has_profile(name, profile):
        have = [p for p in PROFILES if has_profile(name, p)]
        raise ConfigError("profile", profile, f"{' | '.join(have)} for {name} (its run groups define no "
                          f"{profile} profile; text exists for the NORMEC and FEDNORMEC IDs, code for "
                          "ALI-DPFL's)")
    own = _settings(load_experiment(name), profile)
    out = []
    for point in grid_points(name, profile):
        overrides = [f"{k}={value_text(v)}" for k, v in point.items()]
        group = compose((f"experiment={point['experiment']}",))      # its profile settings: one compose a group
        settings = {**_settings(group, profile), **own}
        overrides += [f"{k}={value_text(v)}" for k, v in settings.items()] + [f"profile={profile}"]
        cfg = compose(tuple(overrides))
        out.append(Job(point, overrides, config_key(cfg), cfg))
    unique = {job.key: job for job in reversed(out)}          # blocks may overlap: first one wins
    return [job for job in out if unique[job.key] is job]


def status(run_dir: Path) -> str:
    """completed | diverged | failed | missing (no summary: never run, or killed part-way)."""
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status", "failed")
    except (OSError, ValueError):
        return "missing"


def default_stack() -> int:
    """Runs trained side by side in one process by default: 16 on a GPU, where one stacked pass serves
    them all; 1 on a CPU, where separate processes (``parallel``) do as well or better."""
    import torch

    return 16 if torch.cuda.is_available() else 1


def run_missing(job_list: list[Job], store: Path, parallel: int = 1, threads: int | None = None,
                retry_failed: bool = False, log=print, stack: int = 1) -> dict[str, int]:
    """Train every job whose run is not finished, ``parallel`` processes at a time; returns status counts.

    Each process writes into its runs' store folders, so a crash stays with its runs and the others go
    on. A process trains one run (``train.py``), or with ``stack`` > 1 up to ``stack`` runs that share
    model, data and seed side by side (``normfl.run.train_together``), where a run that diverges or
    fails ends alone. A folder without a summary (a killed run) continues from its checkpoint, or is
    cleared and run again if it has none.
    """
    from normfl.run import shared_key
    from normfl.run.rundir import holder

    skip = FINISHED if retry_failed else (*FINISHED, "failed")
    todo = []
    for job in job_list:
        if status(job.dir(store)) in skip:
            continue
        if held := holder(job.dir(store)):                       # a live run elsewhere: never cleared
            log(f"  running  {job.key}: held by another live process ({held}); left to it")
        else:
            todo.append(job)
    threads = threads or max(1, (os.cpu_count() or 1) // parallel)
    groups: dict[str, list[Job]] = {}
    for job in todo:                       # a job without its config (made by hand) trains alone
        groups.setdefault(shared_key(job.cfg) if job.cfg is not None and stack > 1 else job.key, []).append(job)
    units = [g[i:i + stack] for g in groups.values() for i in range(0, len(g), max(1, stack))]
    log(f"{len(job_list)} runs, {len(job_list) - len(todo)} already stored, {len(todo)} to run "
        f"({parallel} process(es) at a time, {threads} thread(s) each, up to {stack} run(s) per process)")

    def prepare(job: Job) -> tuple[Path, bool]:
        d = job.dir(store)
        resume = (d / checkpoint.NAME).exists()
        if not resume:
            shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True, exist_ok=True)
        return d, resume

    def train(unit: list[Job]) -> list[str]:
        dirs = [prepare(job) for job in unit]
        if len(unit) == 1:
            cmd = [sys.executable, str(ROOT / "train.py"), *unit[0].overrides, f"hydra.run.dir={dirs[0][0]}",
                   f"threads={threads}", "progress=false"]
        else:
            for job, (d, _) in zip(unit, dirs, strict=True):
                (d / ".hydra").mkdir(exist_ok=True)
                OmegaConf.save(job.cfg, d / ".hydra" / "config.yaml")
                OmegaConf.save(OmegaConf.create(job.overrides), d / ".hydra" / "overrides.yaml")
            cmd = [sys.executable, "-m", "normfl.reproduce", "together", *(str(d) for d, _ in dirs),
                   "--threads", str(threads)]
        t0 = time.time()
        out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, text=True)
        states = []
        for job, (d, resume) in zip(unit, dirs, strict=True):
            d.mkdir(parents=True, exist_ok=True)          # a run refused in a stack leaves no folder
            with open(d / "stdout.txt", "a" if resume else "w") as fh:
                fh.write(out.stdout)
            st = status(d)
            if st == "missing":  # refused or crashed before writing its summary
                (d / "summary.json").write_text(json.dumps({"status": "failed", "error": _tail(d / "stdout.txt")}))
                st = "failed"
            log(f"  {st:9s} {time.time() - t0:7.1f} s  {d.name}  {' '.join(job.overrides)}")
            states.append(st)
        return states

    counts: dict[str, int] = {}
    with cf.ThreadPoolExecutor(max_workers=parallel) as pool:
        for states in pool.map(train, units):
            for st in states:
                counts[st] = counts.get(st, 0) + 1
    return counts


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return ""

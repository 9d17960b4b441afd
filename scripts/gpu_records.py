"""One device call's job: the most valuable missing paper-profile records a GPU can make in one call, within a
budget, handed back as archives the CPU side adopts.

    python scripts/gpu_records.py OUT [--call first|second|later] [--budget 9m] [--dry-run] [--profile P]

On a lent GPU (`run` with carry [".gpu"]): ``source .gpu/on-device.sh && python scripts/gpu_records.py $OUT
--call first``. Back here: ``python -m normfl.reproduce adopt <files_at>/*records*.tar.gz``, then
``make figures IDS="normec-t2"``, ``make report`` and commit ``outputs/records``. The calls, in the order of
their value per device-minute:

- ``first``: the main job (``make run``'s command, ``scripts/main_job.py``: on a GPU NORMEC-T2's SN β = γ = 0.1
  cell under the paper profile, which becomes its record), then as many of NORMEC-T2's other best cells (the γ
  the paper prints for each β, with and without SN) as the time left fits side by side;
- ``second``: the GPU tests and the bench of settings B-D (``scripts/gpu_check.py --parts tests bench-bcd``),
  then NFA's CIFAR-10 cells (NORMFEDAVG-T2, T5, T6): one run while none has been timed on a GPU, then as many as
  finish side by side by the time of those made;
- ``later``: the rest of NORMEC-T2, then FEDNORMEC-F1.

A step that finds its records here already is skipped. Runs the budget stops save a checkpoint, archived with
the records (``campaign.archive``: parts of at most 16 MiB). Writes into OUT ``<step>-records.tar.gz`` (and its
``-2``, ``-3`` parts), one per step that trained, and ``logs.tar.gz`` (every step's output and reports); prints
what each step did. A Ctrl-C or SIGTERM stops the call in the step under way (its runs save and are archived;
no later step starts; the logs are still written; exit 130). ``--profile quick`` rehearses a call on a CPU (the
campaign steps take that profile's runs; the main job takes the overrides given after the options; its records
go to the work folder, not the committed store).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
import main_job as make_run  # noqa: E402  (the main job: `make run`)

from normfl.reproduce import campaign, jobs, records, store  # noqa: E402

CALLS = {"first": ("main-job", "t2-best"), "second": ("gpu-check", "nfa-cifar10"), "later": ("t2-rest", "fednormec-f1")}
MAIN_JOB_S = 180          # a NORMEC paper run's seconds before one has run here: 300 passes at 4.07 ms a step (H200)
SIDE_BY_SIDE = 0.75       # what a run added side by side costs, over one alone: 3.07 / 4.07 ms a run-round (H200, bf16)
MAX_FILES = 8             # what a device call hands back


def best_cells(profile: str) -> list[jobs.Job]:
    """NORMEC-T2's cells the paper prints (per block and β, the γ it found best), in the grid's order."""
    return [job for job in jobs.jobs("normec_t2", profile)
            if make_run.printed(job.cfg.algo, "gamma") == job.cfg.algo.gamma]


def cifar10(name: str, profile: str) -> list[jobs.Job]:
    return [job for job in jobs.jobs(name, profile) if job.cfg.dataset._target_.endswith("load_cifar10")]


class Call:
    """One device call: its deadline, where its archives and logs go, the store its runs train in, and its steps
    (the methods named as in ``CALLS``)."""

    def __init__(self, out: Path, work: Path, store_dir: Path, budget_s: float, profile: str, overrides: list[str],
                 dry_run: bool):
        self.out, self.work, self.store, self.profile, self.overrides, self.dry_run = \
            out, work, store_dir, profile, overrides, dry_run
        self.t0 = time.time()
        self.deadline = self.t0 + budget_s * (1 - campaign.GRACE)
        self.lines: list[str] = []

    def left(self) -> float:
        return self.deadline - time.time()

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)

    def missing(self, job_list: list[jobs.Job]) -> list[jobs.Job]:
        return store.pending(job_list, self.store, log=lambda _: None)

    def campaign(self, name: str, job_list: list[jobs.Job], stack: int) -> None:
        """Train the missing ones of ``job_list``, ``stack`` side by side, within the time left; archive."""
        todo = self.missing(job_list)
        if not todo:
            self.say(f"{name}: every run recorded already")
            return
        given = self.left()
        with open(self.work / f"{name}.txt", "a") as log:
            def both(line: str) -> None:
                print(line, flush=True)
                log.write(line + "\n")
            paths = campaign.run(todo, self.store, max(0.0, given) / (1 - campaign.GRACE), stack=stack,
                                 checkpoints=True, out=self.out / f"{name}-records.tar.gz", log=both,
                                 dry_run=self.dry_run, device="cuda" if torch.cuda.is_available() else "cpu")
        self.say(f"{name}: {len(todo)} run(s) given {given / 60:.1f} min, up to {stack} side by side; "
                 f"archive: {' '.join(p.name for p in paths) or 'none'}")

    # -- the steps -------------------------------------------------------------------------------------------

    def main_job(self) -> None:
        """``make run``'s command into the cell's store folder, so the campaign's machinery archives it."""
        job = self.cell()
        if not self.missing([job]) and not self.overrides:
            self.say(f"main-job: recorded already ({job.key})")
            return
        run_dir = job.dir(self.store) if not self.overrides else self.work / "main-job-run"
        cmd = [sys.executable, str(REPO / "scripts" / "main_job.py"), str(run_dir), *self.overrides]
        self.say(f"main-job: {' '.join(cmd[1:])}")
        if self.dry_run:
            return
        t = time.time()
        with store.Stop() as stop, open(self.work / "main-job.txt", "w") as log:
            store.until(stop, cmd, self.deadline, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        print((self.work / "main-job.txt").read_text(), end="", flush=True)
        state = store.status(run_dir)
        self.say(f"main-job: {state if state != 'missing' else 'stopped'} after {(time.time() - t) / 60:.1f} min")
        if run_dir == job.dir(self.store):
            done, stopped = ([job], []) if state in store.FINISHED else ([], [job])
            done = [j for j in done if (records.RECORDS / j.key / "summary.json").is_file()]
            paths = campaign.archive(done, stopped, self.store, self.out / "main-job-records.tar.gz", log=self.say)
            self.say(f"main-job: archive: {' '.join(p.name for p in paths) or 'none'}")
        if state in store.FINISHED:                          # what a whole run takes here (not a failed one's time)
            self.main_s = time.time() - t
        if stop.count:                                       # Ctrl-C or SIGTERM: the call stops here, as a campaign
            raise KeyboardInterrupt

    def fit(self, name: str, todo: list[jobs.Job], each: float | None) -> None:
        """Train the first k of ``todo`` side by side, k as many as finish in the time left (k runs: 1 + 0.75 (k - 1)
        of one run's time: its seed siblings' wall time on this kind of device where they have finished, else
        ``each``; unknown: one run, whose time then sizes the next call), and no more than the files a call hands
        back can carry if all are stopped: runs stopped bring back only checkpoints (13 MB a ResNet20 α-NormEC run,
        a file each)."""
        known = campaign.expected(todo, self.store, "cuda" if torch.cuda.is_available() else "cpu")
        todo = self.missing(todo)
        known = [known[job.key] for job in todo if job.key in known]
        each = statistics.median(known) if known else each
        room = MAX_FILES - 1 - len(list(self.out.iterdir())) if self.out.is_dir() else MAX_FILES - 1
        k = 1                                             # (a stopped run's checkpoint is a file of its own; 1: logs)
        while each and k < min(len(todo), room) and each * (1 + SIDE_BY_SIDE * k) <= self.left():
            k += 1
        self.campaign(name, todo[:k], stack=k)

    def each(self) -> float:
        """One NORMEC paper run's seconds here: this call's main job's, else its record's, else MAIN_JOB_S."""
        if getattr(self, "main_s", None):
            return self.main_s
        summary = records.RECORDS / self.cell().key / "summary.json"
        return json.loads(summary.read_text())["wall_time_s"] if summary.is_file() else MAIN_JOB_S

    def cell(self) -> jobs.Job:
        """NORMEC-T2's cell the main job runs on a GPU."""
        key = jobs.key(tuple(make_run.GPU))
        return next(job for job in jobs.jobs("normec_t2", "paper") if job.key == key)

    def t2_best(self) -> None:
        self.fit("t2-best", [job for job in best_cells(self.profile) if job.key != self.cell().key], self.each())

    def gpu_check(self) -> None:
        cmd = [sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--out", str(self.work / "gpu-check"),
               "--parts", "tests", "bench-bcd"]
        self.say(f"gpu-check: {' '.join(cmd[1:])}")
        if self.dry_run or not torch.cuda.is_available():
            return
        try:
            code = subprocess.call(cmd, cwd=REPO, timeout=max(1.0, self.left()))
        except subprocess.TimeoutExpired:
            code = "stopped at the budget"
        self.say(f"gpu-check: exit {code}; report in logs.tar.gz (gpu-check/report.md)")

    def nfa_cifar10(self) -> None:
        """NFA's CIFAR-10 cells, seed by seed (runs of one seed share data and can step side by side); no NFA
        CIFAR-10 run has been timed on a GPU, so the first call trains one."""
        todo = [j for name in ("normfedavg_t2", "normfedavg_t5", "normfedavg_t6") for j in cifar10(name, self.profile)]
        self.fit("nfa-cifar10", sorted(todo, key=lambda job: job.cfg.seed), None)

    def t2_rest(self) -> None:
        self.fit("t2-rest", jobs.jobs("normec_t2", self.profile), self.each())

    def fednormec_f1(self) -> None:
        self.fit("fednormec-f1", jobs.jobs("fednormec_f1", self.profile), self.each())

    def logs(self) -> Path:
        """Every step's output and reports (not checkpoints or run folders' large files) as OUT/logs.tar.gz."""
        (self.work / "summary.txt").write_text("\n".join(self.lines) + "\n")
        path = self.out / "logs.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            for f in sorted(self.work.rglob("*")):
                if f.is_file() and f.suffix in (".txt", ".md", ".csv", ".json", ".yaml"):
                    tar.add(f, arcname=str(f.relative_to(self.work)))
        return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="where the archives and logs go ($OUT on a device machine)")
    ap.add_argument("--call", choices=list(CALLS), default="first")
    ap.add_argument("--budget", default="9m", help="wall-clock time for the whole call (a command may run 10 min)")
    ap.add_argument("--profile", default="paper", help="the campaign steps' profile (quick: a rehearsal on a CPU)")
    ap.add_argument("--store", type=Path, default=REPO / "outputs" / "store")
    ap.add_argument("--work", type=Path, default=REPO / "outputs" / "gpu-call" / time.strftime("%Y-%m-%d_%H-%M-%S"),
                    help="where the steps' logs are written before logs.tar.gz takes them")
    ap.add_argument("--dry-run", action="store_true", help="say what each step would train, train nothing")
    args, overrides = ap.parse_known_args(argv)
    out, work = args.out.resolve(), args.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if args.profile != "paper":                     # a rehearsal's records stay out of the committed store
        records.RECORDS = work / "records"
    call = Call(out, work, args.store.resolve(), campaign.seconds(args.budget), args.profile, overrides, args.dry_run)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    call.say(f"gpu call '{args.call}' on {device}, {args.budget} budget: {', '.join(CALLS[args.call])}")
    signalled = False
    for step in CALLS[args.call]:
        if signalled or (call.left() <= 0 and not args.dry_run):
            call.say(f"{step}: not started, " + ("a signal stopped the call" if signalled else "the budget is spent"))
            continue
        try:
            getattr(call, step.replace("-", "_"))()
        except KeyboardInterrupt:                    # Ctrl-C or SIGTERM: its runs saved and were archived
            signalled = True
            call.say(f"{step}: stopped by a signal")
    names = [*sorted(p.name for p in out.iterdir()), "logs.tar.gz"]
    call.say(f"done in {(time.time() - call.t0) / 60:.1f} min; handed back: {' '.join(names)}")
    if len(names) > MAX_FILES:
        call.say(f"{len(names)} files in {out}: a device call hands back {MAX_FILES}; adopt what came")
    call.logs()
    return 130 if signalled else 0


if __name__ == "__main__":
    sys.exit(main())

"""Reproduce the papers' figures and tables: ``python -m normfl.reproduce <command> ...``.

    run IDS...      train the missing runs of each ID's grid, then draw its figure/table
    campaign IDS... train their missing runs within --budget, record them, and write an archive of them
    record          add the store's finished runs to the committed records (outputs/records)
    figures [IDS]   draw figures/tables from stored runs only (all IDs by default)
    report          write REPRODUCTION.md from stored runs
    list            the IDs, their grid files and grid sizes
    adopt DIRS...   copy finished hand-made runs into the store when a grid needs them; a campaign's
                    archive (.tar.gz): merge its records and checkpoints into this clone
    together DIRS.. train the runs whose configs the driver left in DIRS side by side (``run --stack``)
    verify NAMES... train committed records again (named by key, or every one of an ID) and say whether each
                    comes out identical, or by how much it differs

IDs are written as in REPRODUCTION.md or as make targets (NORMEC-T2 = normec-t2 = normec_t2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from omegaconf import OmegaConf

from normfl.config import config_key
from normfl.errors import ConfigError
from normfl.reproduce import jobs, records, store

STORE_ENV = "NORMFL_STORE"      # where the run store is; default outputs/store under the working directory


# what each command reads beyond its names; another option given to it is refused, not ignored
READS = {"run": ("profile", "parallel", "threads", "stack", "match", "retry_failed", "dry_run", "store", "launcher"),
         "campaign": ("profile", "parallel", "threads", "stack", "match", "dry_run", "store", "budget", "checkpoints",
                      "archive"),
         "record": ("store",), "figures": ("profile", "store"), "report": ("store",), "list": (),
         "adopt": ("profile", "store"), "together": ("threads",), "verify": ("profile", "threads")}
# what each command takes as names (the others take none)
NAMES = {"run": "IDs", "campaign": "IDs", "figures": "IDs", "adopt": "run folders or archives",
         "together": "run folders", "verify": "record keys or IDs"}


def check_reads(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse an option the command does not read, names where it takes none, and none where it needs them."""
    for dest in dict.fromkeys(d for reads in READS.values() for d in reads):
        if dest not in READS[args.command] and getattr(args, dest) != ap.get_default(dest):
            takers = [c for c, reads in READS.items() if dest in reads]
            raise ConfigError(f"--{dest.replace('_', '-')}", getattr(args, dest),
                              f"only with {' or '.join(takers)} (not read by {args.command})")
    if args.command not in NAMES and args.names:
        raise ConfigError(args.command, args.names, "no names (it takes none)")
    if args.command in ("adopt", "together", "verify") and not args.names:
        raise ConfigError(args.command, [], f"one or more {NAMES[args.command]}")
    if args.store is not None and not (args.store.is_dir() or (args.command in ("run", "campaign", "adopt")
                                                                and not args.store.exists())):
        raise ConfigError("--store", str(args.store), "an existing run store directory (run, campaign and adopt "
                          "make a new one)")


def store_dir(given: Path | None = None) -> Path:
    """The run store: ``given``, else $NORMFL_STORE, else outputs/store under the working directory; absolute,
    because runs are launched from the checkout."""
    return Path(given or os.environ.get(STORE_ENV) or "outputs/store").resolve()


def main(argv=None) -> None:
    sys.stdout.reconfigure(line_buffering=True)       # a campaign's log, read with tail -f, says each end at once
    ap = argparse.ArgumentParser(prog="python -m normfl.reproduce", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("run", "campaign", "record", "figures", "report", "list", "adopt",
                                        "together", "verify"))
    ap.add_argument("names", nargs="*", help="IDs (run, figures), run folders (adopt, together), record keys or "
                    "IDs (verify)")
    ap.add_argument("--profile", default="paper", choices=jobs.PROFILES)
    ap.add_argument("--parallel", type=int, default=1, help="runs trained at once")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / parallel)")
    ap.add_argument("--stack", type=int, default=None,
                    help="runs sharing model, data and seed trained side by side in one process (default: 16 on a "
                         "GPU, 1 on a CPU)")
    ap.add_argument("--match", action="append", default=None,
                    help="only the runs whose train.py command contains this text (given again: any of them)")
    ap.add_argument("--retry-failed", action="store_true", help="also re-run runs stored as failed")
    ap.add_argument("--dry-run", action="store_true", help="list what would run, run nothing")
    ap.add_argument("--store", type=Path, default=None, help=f"the run store (default: ${STORE_ENV}, else "
                    "outputs/store under the working directory)")
    ap.add_argument("--launcher", default=None, help="train through this Hydra launcher (slurm, joblib, "
                    "submitit_local, stacked): one `train.py -m` sweep per block of the grid, each job into its "
                    "store folder; key=value words among the names go to train.py, e.g. hydra.launcher.partition=gpu")
    ap.add_argument("--budget", default="25m", help="campaign: wall-clock time to train within (90s, 25m, 2h)")
    ap.add_argument("--checkpoints", action="store_true", help="campaign: also archive unfinished runs' checkpoints")
    ap.add_argument("--archive", type=Path, default=None, help="campaign: where to write the archive "
                    "(default outputs/campaigns/<time>.tar.gz)")
    args = ap.parse_intermixed_args(argv)
    args.overrides = [n for n in args.names if "=" in n]
    args.names = [n for n in args.names if "=" not in n]
    check_reads(ap, args)
    args.store = store_dir(args.store)
    if args.overrides and args.launcher is None:
        raise ConfigError("--launcher", None, f"a Hydra launcher for the train.py overrides {args.overrides}")
    if args.launcher and args.match:
        raise ConfigError("--match", args.match, "no --match with --launcher (a launcher trains whole sweeps)")
    if args.launcher and args.launcher not in (have := jobs.launchers()):
        raise ConfigError("--launcher", args.launcher, " | ".join(have))
    for flag, value in (("--parallel", args.parallel), ("--threads", args.threads), ("--stack", args.stack)):
        if value is not None and value < 1:
            raise ConfigError(flag, value, "a whole number, at least 1")

    from normfl.reproduce import targets

    def wanted(job) -> bool:
        return args.match is None or any(m in job.command() for m in args.match)

    if args.command == "adopt" and args.names and all(n.endswith((".tar.gz", ".tgz")) for n in args.names):
        from normfl.reproduce import campaign

        if missing := [n for n in args.names if not Path(n).is_file()]:
            raise ConfigError("adopt", missing, "archives that exist (a campaign's .tar.gz)")
        refused = sum(campaign.adopt(Path(n), args.store) for n in args.names)
        if refused:
            sys.exit(f"normfl: {refused} record(s) refused, the rest merged")
        return None
    if args.command == "adopt":
        return adopt(args.names, args.profile, args.store)
    if args.command == "record":
        for d in sorted(p.parent for p in args.store.glob("*/summary.json")):
            if store.status(d) in store.FINISHED:
                print(f"  {records.pack(d):6s} {d.name}")
        return None
    if args.command == "together":
        return together(args.names, args.threads)
    if args.command == "verify":
        from normfl.reproduce import verify

        run_dirs = verify.record_dirs(args.names, args.profile)
        print(f"verify: {len(run_dirs)} record(s), trained again one at a time")
        if differing := verify.verify(run_dirs, args.threads):
            sys.exit(f"normfl: {differing} of {len(run_dirs)} record(s) did not come out identical")
        return None
    if args.command == "list":
        for t in targets.TARGETS.values():
            sizes = ", ".join(f"{p} {len(jobs.grid_points(t.grid, p))}" for p in jobs.PROFILES
                              if jobs.has_profile(t.grid, p))
            print(f"{t.id:14s} grids/{t.grid}.yaml, grid points: {sizes}; {t.title}")
        return None
    chosen = [targets.get(n) for n in args.names] or [t for t in targets.TARGETS.values()
                                                       if jobs.has_profile(t.grid, args.profile)]
    grids = {t.id: [j for j in jobs.jobs(t.grid, args.profile) if wanted(j)]
             for t in chosen if args.command in ("run", "campaign")}
    if args.match and not any(grids.values()):
        raise ConfigError("--match", args.match, "text in the train.py command of at least one run of "
                          f"{', '.join(t.id for t in chosen)} (`--dry-run` without --match lists them)")
    if args.command == "campaign":
        from normfl.reproduce import campaign

        job_list = list({j.key: j for t in chosen for j in grids[t.id]}.values())
        try:
            budget = campaign.seconds(args.budget)
        except ValueError as err:
            raise ConfigError("--budget", args.budget, "a duration such as 90s, 25m or 2h") from err
        if budget <= 0:
            raise ConfigError("--budget", args.budget, "a duration above zero, such as 90s, 25m or 2h")
        if args.archive is not None and (there := campaign.parts_there(args.archive)):
            raise ConfigError("--archive", str(args.archive), f"a path where no archive is yet ({there[0]} is "
                              "there, and a campaign never writes over one)")
        from normfl.engine.flat import pick_device

        paths = campaign.run(job_list, args.store, budget, args.parallel, args.threads, args.checkpoints,
                             args.archive, dry_run=args.dry_run, stack=args.stack or store.default_stack(),
                             device=pick_device("auto").type)
        if args.dry_run:
            return None
        if not paths:
            print("archive: none (no run finished or stopped)")
        else:
            print(f"archive: {' '.join(map(str, paths))}" + (f" ({len(paths)} parts: adopt them all)"
                                                             if len(paths) > 1 else ""))
        return None
    if args.command == "run":
        print(f"store: {args.store}")
        for t in chosen:
            job_list = grids[t.id]
            print(f"{t.id} ({args.profile}):")
            if args.dry_run:
                for j in job_list:
                    print(f"  {store.status(records.locate(j.key, args.store)):9s} {j.key}  {j.command()}")
                continue
            if args.launcher:
                launch(t, args)
                continue
            store.run_missing(job_list, args.store, args.parallel, args.threads, args.retry_failed,
                              stack=args.stack or store.default_stack())
    if args.command in ("run", "figures") and not args.dry_run:
        from normfl.reproduce import figures

        for t in chosen:
            for path in figures.draw(t, args.profile, args.store):
                print(f"  wrote {path.relative_to(store.ROOT)}")
    if args.command == "report":
        from normfl.reproduce import report

        path = report.write(args.store)
        print(f"wrote {path.relative_to(store.ROOT)}")
    return None


def launch(target, args) -> None:
    """Train an ID's grid through a Hydra launcher: a ``train.py -m`` sweep per block, its jobs writing into
    their store folders (``${store_key:}``; finished runs there are left as they are, killed ones resume),
    its table of jobs in ``launches/<id>/<time>`` beside the store."""
    import time

    sweep_dir = args.store.parent / "launches" / target.slug / time.strftime("%Y-%m-%d_%H-%M-%S")
    with store.Stop() as stop:                  # Ctrl-C: each sweep's running jobs save a checkpoint, none starts after
        for i, overrides in enumerate(jobs.sweeps(target.grid, args.profile)):
            cmd = [sys.executable, str(store.ROOT / "train.py"), "-m", *overrides, f"hydra/launcher={args.launcher}",
                   f"hydra.sweep.dir={sweep_dir / str(i)}", f"hydra.sweep.subdir={args.store}/${{store_key:}}",
                   "progress=false", *([f"threads={args.threads}"] if args.threads else []), *args.overrides]
            with stop.child(cmd, cwd=store.ROOT) as proc:
                if proc is None:
                    break
                print("  " + " ".join(cmd[1:]), flush=True)
                proc.wait()
    if stop.count:
        print("stopped; the same command continues the stopped runs from their checkpoints", flush=True)
        raise KeyboardInterrupt


def together(dirs: list[str], threads: int | None) -> None:
    """Train the runs whose configs ``run_missing`` left in ``DIR/.hydra/config.yaml`` side by side."""
    import logging

    from normfl.run import train_together

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    if missing := [d for d in dirs if not (Path(d) / ".hydra" / "config.yaml").is_file()]:
        raise ConfigError("together", missing, "run folders holding .hydra/config.yaml (left by `run --stack`)")
    jobs = []
    for d in map(Path, dirs):
        cfg = OmegaConf.load(d / ".hydra" / "config.yaml")
        cfg.threads, cfg.progress = threads, False
        jobs.append((cfg, d))
    train_together(jobs, max_runs=len(jobs))


def adopt(dirs: list[str], profile: str, store_dir: Path) -> None:
    """Copy finished runs made by hand into the store under the key their config has with
    ``profile`` set, so a grid that needs exactly that run does not train it again."""
    if missing := [d for d in dirs if not Path(d).is_dir()]:
        raise ConfigError("adopt", missing, "run folders that exist (or a campaign's .tar.gz archives)")
    for d in map(Path, dirs):
        cfg_file = d / ".hydra" / "config.yaml"
        if store.status(d) not in store.FINISHED or not cfg_file.is_file():
            print(f"skipped {d}: not a finished run")
            continue
        cfg = OmegaConf.load(cfg_file)
        cfg.profile = profile
        target = store_dir / config_key(cfg)
        if target.exists():
            print(f"skipped {d}: the store already has {target.name}")
            continue
        shutil.copytree(d, target)
        OmegaConf.save(cfg, target / ".hydra" / "config.yaml")
        summary = json.loads((target / "summary.json").read_text())    # now the run of the config beside it
        summary.update(config_key=target.name, profile=profile, adopted_from=str(d),
                       adopted_key=summary.get("config_key"))
        (target / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"adopted {d} as {target.name}")


if __name__ == "__main__":
    try:
        main()
    except ConfigError as err:
        sys.exit(f"normfl: {err}")
    except KeyboardInterrupt as err:        # said where it stopped (store.Stop); no traceback, the shell's code
        sys.exit(128 + getattr(err, "signum", signal.SIGINT))         # SIGTERM to `together`: signals.Stopped

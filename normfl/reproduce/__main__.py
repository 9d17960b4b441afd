"""Reproduce the papers' figures and tables: ``python -m normfl.reproduce <command> ...``.

One command per function below (``cmd_run``, ``cmd_campaign``, ...), each an argparse sub-command that declares
only the options it reads: ``python -m normfl.reproduce --help`` lists the commands, ``... COMMAND --help`` gives
one's options. An option a command does not read is refused, not ignored.

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


def store_dir(given: Path | None = None) -> Path:
    """The run store: ``given``, else $NORMFL_STORE, else outputs/store under the working directory; absolute,
    because runs are launched from the checkout."""
    return Path(given or os.environ.get(STORE_ENV) or "outputs/store").resolve()


def option_groups() -> dict[str, argparse.ArgumentParser]:
    """The options, each defined once, in groups that the commands reading them take as argparse parents."""
    groups = {name: argparse.ArgumentParser(add_help=False)
              for name in ("profile", "store", "threads", "train", "run", "campaign", "figures")}
    groups["profile"].add_argument("--profile", default="paper", choices=jobs.PROFILES)
    groups["store"].add_argument("--store", type=Path, default=None, help=f"the run store (default: ${STORE_ENV}, "
                                 "else outputs/store under the working directory)")
    groups["threads"].add_argument("--threads", type=int, default=None,
                                   help="torch threads per run (default: cores / parallel)")
    train = groups["train"]                     # run and campaign
    train.add_argument("--parallel", type=int, default=1, help="runs trained at once")
    train.add_argument("--stack", type=int, default=None,
                       help="runs sharing model, data and seed trained side by side in one process (default: 16 "
                            "on a GPU, 1 on a CPU)")
    train.add_argument("--match", action="append", default=None,
                       help="only the runs whose train.py command contains this text (given again: any of them)")
    train.add_argument("--dry-run", action="store_true", help="list what would run, run nothing")
    run = groups["run"]
    run.add_argument("--retry-failed", action="store_true", help="also re-run runs stored as failed")
    run.add_argument("--launcher", default=None, help="train through this Hydra launcher (slurm, joblib, "
                     "submitit_local, stacked): the missing runs of every ID named in one `train.py -m` sweep (on "
                     "SLURM one job array), each job into its store folder; key=value words among the names go to "
                     "train.py, e.g. hydra.launcher.partition=gpu")
    campaign = groups["campaign"]
    campaign.add_argument("--budget", default="25m", help="wall-clock time to train within (90s, 25m, 2h)")
    campaign.add_argument("--checkpoints", action="store_true", help="also archive unfinished runs' checkpoints")
    campaign.add_argument("--archive", type=Path, default=None, help="where to write the archive "
                          "(default outputs/campaigns/<time>.tar.gz)")
    groups["figures"].add_argument("--all-profiles", action="store_true",
                                   help="each ID in every profile its grid has, instead of --profile's")
    return groups


def chosen(args) -> list:
    """The IDs named, else every ID whose grid has the profile."""
    from normfl.reproduce import targets

    return [targets.get(n) for n in args.names] or [t for t in targets.TARGETS.values()
                                                     if jobs.has_profile(t.grid, args.profile)]


def grid_jobs(args, ids: list) -> dict[str, list]:
    """Each ID's runs, only those whose train.py command contains a --match text when there is one."""
    grids = {t.id: [j for j in jobs.jobs(t.grid, args.profile)
                    if args.match is None or any(m in j.command() for m in args.match)] for t in ids}
    if args.match and not any(grids.values()):
        raise ConfigError("--match", args.match, "text in the train.py command of at least one run of "
                          f"{', '.join(t.id for t in ids)} (`--dry-run` without --match lists them)")
    return grids


def draw(ids: list, args, profile: str | None = None) -> None:
    """Draw each ID's figure or table from the stored runs (in ``profile``, by default ``--profile``'s)."""
    from normfl.reproduce import figures

    for t in ids:
        for path in figures.draw(t, profile or args.profile, args.store):
            print(f"  wrote {os.path.relpath(path, store.ROOT)}")


def cmd_run(args) -> None:
    """Train the missing runs of each ID's grid, then draw its figure or table.

    Every ID with the profile when none is named; --dry-run lists each run's status and command instead, and
    --launcher trains through a Hydra launcher (key=value words among the IDs go to train.py)."""
    ids = chosen(args)
    grids = grid_jobs(args, ids)
    print(f"store: {args.store}")
    unfinished = 0
    if args.launcher and not args.dry_run:
        unfinished = launch(ids, [j for t in ids for j in grids[t.id]], args)
    else:
        for t in ids:
            print(f"{t.id} ({args.profile}):")
            if args.dry_run:
                for j in grids[t.id]:
                    print(f"  {store.status(records.locate(j.key, args.store)):9s} {j.key}  {j.command()}")
            else:
                store.run_missing(grids[t.id], args.store, args.parallel, args.threads, args.retry_failed,
                                  stack=args.stack or store.default_stack())
    if not args.dry_run:
        draw(ids, args)
    if unfinished:
        sys.exit(f"normfl: {unfinished} run(s) did not finish (the launch's lines say which and why)")


def cmd_campaign(args) -> None:
    """Train the IDs' missing runs within --budget, record them, and write an archive of them.

    Every ID with the profile when none is named; the archive (outputs/campaigns/<time>.tar.gz unless --archive
    says where) is for `adopt` on another clone."""
    from normfl.reproduce import campaign

    ids = chosen(args)
    grids = grid_jobs(args, ids)
    job_list = list({j.key: j for t in ids for j in grids[t.id]}.values())
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
        return
    if not paths:
        print("archive: none (no run finished or stopped)")
    else:
        print(f"archive: {' '.join(map(str, paths))}" + (f" ({len(paths)} parts: adopt them all)"
                                                         if len(paths) > 1 else ""))


def cmd_record(args) -> None:
    """Add the store's finished runs to the committed records (outputs/records)."""
    for d in sorted(p.parent for p in args.store.glob("*/summary.json")):
        if store.status(d) in store.FINISHED:
            print(f"  {records.pack(d):6s} {d.name}")


def cmd_figures(args) -> None:
    """Draw figures and tables from stored runs only, training nothing: the IDs named, else every ID with the
    profile; with --all-profiles, in each profile their grids have (what `make figures IDS="..."` runs)."""
    if not args.all_profiles:
        return draw(chosen(args), args)
    from normfl.reproduce import targets

    named = [targets.get(n) for n in args.names] or list(targets.TARGETS.values())
    for profile in jobs.PROFILES:
        draw([t for t in named if jobs.has_profile(t.grid, profile)], args, profile)


def cmd_report(args) -> None:
    """Write REPRODUCTION.md from stored runs."""
    from normfl.reproduce import report

    print(f"wrote {report.write(args.store).relative_to(store.ROOT)}")


def cmd_list(args) -> None:
    """List the IDs, their grid files and grid sizes."""
    from normfl.reproduce import targets

    for t in targets.TARGETS.values():
        sizes = ", ".join(f"{p} {len(jobs.grid_points(t.grid, p))}" for p in jobs.PROFILES
                          if jobs.has_profile(t.grid, p))
        print(f"{t.id:14s} grids/{t.grid}.yaml, grid points: {sizes}; {t.title}")


def cmd_adopt(args) -> None:
    """Copy finished hand-made runs into the store, or merge campaigns' archives into this clone.

    Run folders are filed under the key their config has with --profile set, so a grid that needs exactly that
    run does not train it again; a campaign's archives (.tar.gz) bring their records and checkpoints."""
    if not all(n.endswith((".tar.gz", ".tgz")) for n in args.names):
        return adopt(args.names, args.profile, args.store)
    from normfl.reproduce import campaign

    if missing := [n for n in args.names if not Path(n).is_file()]:
        raise ConfigError("adopt", missing, "archives that exist (a campaign's .tar.gz)")
    if refused := sum(campaign.adopt(Path(n), args.store) for n in args.names):
        sys.exit(f"normfl: {refused} record(s) refused, the rest merged")


def cmd_together(args) -> None:
    """Train side by side the runs whose configs the driver left in the run folders (``run --stack``)."""
    together(args.names, args.threads)


def cmd_verify(args) -> None:
    """Train committed records again, one at a time, and say whether each comes out identical or how far not.

    Records are named by key, or all of an ID's by the ID."""
    from normfl.reproduce import verify

    run_dirs = verify.record_dirs(args.names, args.profile)
    print(f"verify: {len(run_dirs)} record(s), trained again one at a time")
    if differing := verify.verify(run_dirs, args.threads):
        sys.exit(f"normfl: {differing} of {len(run_dirs)} record(s) did not come out identical")


# each command: its function, the option groups it reads, and its names (None: it takes none): their metavar,
# what they are, and whether it needs at least one
VERBS = {"run": (cmd_run, ("profile", "train", "run", "threads", "store"), ("ID", "IDs", False)),
         "campaign": (cmd_campaign, ("profile", "train", "campaign", "threads", "store"), ("ID", "IDs", False)),
         "record": (cmd_record, ("store",), None),
         "figures": (cmd_figures, ("profile", "figures", "store"), ("ID", "IDs", False)),
         "report": (cmd_report, ("store",), None),
         "list": (cmd_list, (), None),
         "adopt": (cmd_adopt, ("profile", "store"), ("DIR|ARCHIVE", "run folders or archives", True)),
         "together": (cmd_together, ("threads",), ("DIR", "run folders", True)),
         "verify": (cmd_verify, ("profile", "threads"), ("KEY|ID", "record keys or IDs", True))}


def parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command line and its sub-parsers: one a command, with the options it reads, its function as ``func``."""
    groups = option_groups()
    ap = argparse.ArgumentParser(prog="python -m normfl.reproduce", description=__doc__.split("\n")[0],
                                 epilog=__doc__.strip().split("\n")[-1])
    subs = ap.add_subparsers(dest="command", required=True, metavar="command")
    for verb, (func, reads, names) in VERBS.items():
        sub = subs.add_parser(verb, help=func.__doc__.split("\n")[0], description=func.__doc__,
                              parents=[groups[g] for g in reads])
        if names:
            sub.add_argument("names", nargs="*", metavar=names[0], help=names[1])
        sub.set_defaults(func=func, names=[])
    return ap, subs.choices


def reads(verb: str) -> set[str]:
    """The options ``verb`` reads, by dest."""
    groups = option_groups()
    return {dest for g in VERBS[verb][1] for dest in vars(groups[g].parse_args([]))}


def refuse(sub: argparse.ArgumentParser, verb: str, rest: list[str], unknown: list[str]) -> None:
    """Refuse the options among ``rest`` (what follows ``verb``) that ``verb`` does not read: by the commands
    that read one, else as ``verb``'s sub-parser ``sub`` refuses ``unknown``."""
    every = argparse.ArgumentParser(prog=f"python -m normfl.reproduce {verb}", add_help=False,
                                    parents=list(option_groups().values()))
    given, _ = every.parse_known_args(rest)
    for dest, value in vars(given).items():
        if value != every.get_default(dest) and dest not in reads(verb):
            takers = [v for v in VERBS if dest in reads(v)]
            raise ConfigError(f"--{dest.replace('_', '-')}", value,
                              f"only with {' or '.join(takers)} (not read by {verb})")
    sub.error(f"unrecognized arguments: {' '.join(unknown)}")


def check(args) -> None:
    """Refuse names where the command takes none, none where it needs them, a store that is not one, and bad
    option values, before any work; set ``args.store`` to the store's absolute path."""
    _, options, names = VERBS[args.command]
    args.overrides = [n for n in args.names if "=" in n]
    args.names = [n for n in args.names if "=" not in n]
    if names is None and args.names:
        raise ConfigError(args.command, args.names, "no names (it takes none)")
    if names and names[2] and not args.names:
        raise ConfigError(args.command, [], f"one or more {names[1]}")
    if "store" in options:
        if args.store is not None and not (args.store.is_dir() or (args.command in ("run", "campaign", "adopt")
                                                                    and not args.store.exists())):
            raise ConfigError("--store", str(args.store), "an existing run store directory (run, campaign and "
                              "adopt make a new one)")
        args.store = store_dir(args.store)
    launcher = getattr(args, "launcher", None)
    if args.overrides and launcher is None:
        raise ConfigError("--launcher", None, f"a Hydra launcher for the train.py overrides {args.overrides}")
    if launcher and launcher not in (have := jobs.launchers()):
        raise ConfigError("--launcher", launcher, " | ".join(have))
    for flag in ("--parallel", "--threads", "--stack"):
        if (value := getattr(args, flag[2:], None)) is not None and value < 1:
            raise ConfigError(flag, value, "a whole number, at least 1")


def main(argv=None) -> None:
    """Parse the command line, refuse what its command would not read, and run the command."""
    sys.stdout.reconfigure(line_buffering=True)       # a campaign's log, read with tail -f, says each end at once
    argv = sys.argv[1:] if argv is None else list(argv)
    ap, subs = parser()
    args, extra = ap.parse_known_args(argv)
    if any(a.startswith("-") for a in extra):
        refuse(subs[args.command], args.command, argv[argv.index(args.command) + 1:], extra)
    args.names = [*args.names, *extra]      # names after an option: argparse takes only the first run of them
    check(args)
    args.func(args)


def launch(ids: list, job_list: list, args) -> int:
    """Train the IDs' runs that are not finished through a Hydra launcher: one listed ``train.py -m`` sweep of them
    all (``hydra/sweeper=listed``; on SLURM one job array, so the grid fills the cluster at once), each job writing
    into its store folder (``${store_key:}``; killed ones resume), a finished or recorded run given no job. Its table
    of jobs goes to ``launches/<id>/<time>`` beside the store. Each finished run is then recorded, as ``run_missing``
    records one. Returns how many runs of the sweep did not finish."""
    import time

    from normfl.results import FINISHED

    extra = [o for o in args.overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]   # in the runs' keys
    runs = list({j.key: j for j in (jobs.Job(j.params, overrides, jobs.key(tuple(overrides)), None, j.method)
                                    for j in job_list for overrides in [[*j.overrides, *extra]])}.values())
    todo = store.pending(runs, args.store, FINISHED if args.retry_failed else (*FINISHED, "failed"))
    print(f"{' '.join(t.id for t in ids)} ({args.profile}): {len(runs)} runs, {len(runs) - len(todo)} already "
          f"stored, {len(todo)} to run through hydra/launcher={args.launcher}")
    stopped = False
    if todo:
        name = ids[0].slug if len(ids) == 1 else f"{len(ids)}-ids"
        sweep_dir = args.store.parent / "launches" / name / time.strftime("%Y-%m-%d_%H-%M-%S")
        sweep_dir.mkdir(parents=True)
        (sweep_dir / "runs.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create([j.overrides for j in todo])))
        cmd = [sys.executable, str(store.ROOT / "train.py"), "-m", "hydra/sweeper=listed",
               f"hydra.sweeper.file={sweep_dir / 'runs.yaml'}", f"hydra/launcher={args.launcher}",
               f"hydra.sweep.dir={sweep_dir}", f"hydra.sweep.subdir={args.store}/${{store_key:}}", "progress=false",
               *([f"threads={args.threads}"] if args.threads else []), *(o for o in args.overrides if o not in extra)]
        with store.Stop() as stop, stop.child(cmd, cwd=store.ROOT) as proc:   # Ctrl-C: each job saves a checkpoint
            print("  " + " ".join(cmd[1:]), flush=True)
            proc.wait()
        stopped = bool(stop.count)
    for j in runs:                             # the committed results store gains each finished run (records.py)
        if store.status(j.dir(args.store)) in FINISHED:
            try:
                if (packed := records.pack(j.dir(args.store))) == "added":
                    print(f"  record {packed} {j.key}")
            except records.RecordError as err:
                print(f"  record {err}")
    if stopped:
        print("stopped; the same command continues the stopped runs from their checkpoints", flush=True)
        raise KeyboardInterrupt
    return sum(store.status(j.dir(args.store)) not in FINISHED for j in todo)


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

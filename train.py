"""Entry point: `python train.py [overrides]` runs one experiment, `python train.py -m ...` a sweep."""

import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

sys.path.append(str(Path(__file__).resolve().parent / "normfl" / "launchers"))   # hydra/launcher=stacked


def _store_key(*, _root_):
    """``hydra.sweep.subdir=<store>/${store_key:}``: a job's run store folder (``python -m normfl.reproduce run
    ID --launcher NAME``). Hydra hands resolvers to its launchers' worker processes."""
    from normfl.run.cli import store_key

    return store_key(_root_)


OmegaConf.register_new_resolver("store_key", _store_key, replace=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig):
    from normfl.run import main as run_main

    return run_main(cfg)


if __name__ == "__main__":
    from normfl.run.cli import home_paths, hydra_errors

    sys.argv[1:] = home_paths(sys.argv[1:])        # ~/... as a shell passes it, made readable to Hydra
    try:
        with hydra_errors(sys.argv[1:]):
            main()
    except KeyboardInterrupt as stop:     # a sweep stopped at once (normfl.run.sweep.SweepStop), or Ctrl-C before a run
        sys.exit(128 + getattr(stop, "signum", signal.SIGINT))

"""Entry point: `python train.py [overrides]` runs one experiment, `python train.py -m ...` a sweep."""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

sys.path.append(str(Path(__file__).resolve().parent / "normfl" / "launchers"))   # hydra/launcher=stacked


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig):
    from normfl.run import main as run_main

    return run_main(cfg)


if __name__ == "__main__":
    main()

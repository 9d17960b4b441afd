"""Where things are: the repository, its configs, the offline copies of the real datasets, and the scripts."""

import importlib.util
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
OFFLINE = Path(os.environ.get("NORMFL_OFFLINE_DATA", REPO.parent / "shared" / "data"))


def script(name: str):
    """``scripts/<name>.py`` loaded as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

"""Where things are: the repository, its configs, and the offline copies of the real datasets."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
OFFLINE = Path(os.environ.get("NORMFL_OFFLINE_DATA", REPO.parent / "shared" / "data"))

"""Test-only parts loaded by config (tests/conf, through hydra.searchpath)."""

from normfl.algorithms import NormEC


class Crasher(NormEC):
    """α-NormEC that raises in round 1, as an unforeseen bug would mid-run."""

    def round(self, k, x, clients):
        if k == 1:
            raise RuntimeError("crashed on purpose in round 1")
        return super().round(k, x, clients)

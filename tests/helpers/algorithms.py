"""Algorithms outside normfl that the tests load by config (``tests/conf/algo`` through ``hydra.searchpath``, or
``algo._target_=tests.helpers.NAME``)."""

import torch

from normfl.algorithms import NormEC


class Crasher(NormEC):
    """α-NormEC that raises in round 1, as an unforeseen bug would mid-run."""

    def round(self, k, x, clients):
        if k == 1:
            raise RuntimeError("crashed on purpose in round 1")
        return super().round(k, x, clients)


class ForgetfulMomentum(NormEC):
    """α-NormEC with heavy-ball momentum on the server's step, as a user might add it, the momentum ``m`` left out
    of ``state``: a checkpoint would lose it."""

    def setup(self, x0, num_clients, rounds, privacy, seed, **kw):
        super().setup(x0, num_clients, rounds, privacy, seed, **kw)
        self.m = None

    def round(self, k, x, clients):
        x_new, info = super().round(k, x, clients)
        m = getattr(self, "m", None)
        self.m = x_new - x if m is None else 0.9 * m + (x_new - x)
        return x + self.m, info


class LateMomentum(ForgetfulMomentum):
    """The same, its momentum first made in round 0 (no value at set-up)."""

    def setup(self, x0, num_clients, rounds, privacy, seed, **kw):
        NormEC.setup(self, x0, num_clients, rounds, privacy, seed, **kw)


class Momentum(ForgetfulMomentum):
    """The same, its momentum declared."""

    state = (*NormEC.state, "m")


class WithoutAutograd(NormEC):
    """α-NormEC whose round runs with autograd off, as a user might write one for speed."""

    def round(self, k, x, clients):
        with torch.no_grad():
            return super().round(k, x, clients)

"""Empirical privacy audits: a lower bound on ε beside the certified upper bound.

- ``stats``: the statistics that turn scores into bounds (Clopper-Pearson (ε, δ) bounds, the Gaussian-DP
  route, the test against a certified trade-off curve); it never sees how scores are made;
- ``canaries``: canaries beside a private run (``audit.canaries=N``), scored through the run's own
  bounding operator, privatizer and sampler, one design per mechanism family;
- ``release``: canary clients through the algorithm's own round (``audit.mode=release``), scored from the models the
  server broadcasts, with a check that no un-noised value reaches them and that the accountant counts every release;
- ``messages``: mechanism-level audits of the discrete mechanisms (QTDL, the Binomial) on a pair of inputs.
"""


def observer(algo, clients, n: int, x0, seed: int, mode: str = "sidecar"):
    """The audit of a run with ``audit.canaries=n`` (``mode``: ``sidecar`` or ``inband``, the canaries of its
    privatizer's family; ``release``, canary clients through its round), built after ``algo.setup``."""
    if mode == "release":
        from normfl.privacy.audit.release import Release

        return Release(algo, clients, n, x0, seed)
    from normfl.privacy.audit.canaries import canaries_for

    return canaries_for(algo, clients, n, x0.numel(), seed, x0.device, x0.dtype, mode)


def joining(cfg) -> int:
    """How many canary clients join the run (``audit.mode=release``): its algorithm is set up for n + this many."""
    audit = cfg.get("audit") or {}
    return int(audit.get("canaries") or 0) if audit.get("mode") == "release" else 0

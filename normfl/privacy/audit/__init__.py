"""Empirical privacy audits: a lower bound on ε beside the certified upper bound.

- ``stats``: the statistics that turn scores into bounds (Clopper-Pearson (ε, δ) bounds, the Gaussian-DP
  route, the test against a certified trade-off curve); it never sees how scores are made;
- ``canaries``: canaries beside a private run (``audit.canaries=N``), scored through the run's own
  bounding operator, privatizer and sampler, one design per mechanism family;
- ``messages``: mechanism-level audits of the discrete mechanisms (QTDL, the Binomial) on a pair of inputs.
"""

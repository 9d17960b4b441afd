"""Which runs side by side step as one vectorized round (``normfl.run.vectorized.group_key``): runs whose round would
mix (another participation draw, cohort or sampling kind, draws' seed, local steps, algorithm, privacy, who adds the
noise, Ψ) are kept apart, those that differ only in scalars are grouped; and runs of different participation given
together each train on their own participants, counted here from their own draws."""

import copy

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from normfl.ops import Participation
from normfl.run import start, train_together, vectorized
from tests.helpers import config

# Fed-α-NormEC and FedAvg runs of 4 clients at step 0: each letter a run, those sharing a letter's first character
# and a digit form one group (A1, A2); every other run differs from each of them in one key the group must keep
RUNS = {
    "A1": ["algo=fed_normec", "p=0.3", "algo.beta=0.1"],
    "A2": ["algo=fed_normec", "p=0.3", "algo.beta=0.5", "algo.gamma=0.05", "algo.eta=0.2"],   # scalars only
    "B": ["algo=fed_normec", "p=0.6", "algo.beta=0.1"],                                        # p
    "C": ["algo=fed_normec", "p=0.3", "algo_seed=7"],                                          # the draws' seed
    "D": ["algo=fed_normec", "p=0.5"],                                                         # p = 2/4, Bernoulli
    "E1": ["algo=fed_normec", "algo.participation=cohort", "algo.cohort_size=2"],              # ... a cohort of 2
    "E2": ["algo=fed_normec", "algo.participation=cohort", "algo.cohort_size=2", "algo.beta=0.5"],
    "F": ["algo=fed_normec", "algo.participation=cohort", "algo.cohort_size=3"],              # cohort size
    "G": ["algo=fed_normec", "p=0.3", "algo.local_steps=2"],                                   # local steps: alone
    "H": ["algo=fedavg", "p=0.3"],                                                             # the algorithm
    "I1": ["algo=dp_fedavg", "p=0.3", "algo.beta=0.1"],                                        # private
    "I2": ["algo=dp_fedavg", "p=0.3", "algo.beta=0.3", "privacy.epsilon=2"],
    "J": ["algo=dp_fedavg", "p=0.3", "algo.noise_by=server"],                                  # who adds the noise
    "K": ["algo=dp_fedavg", "p=0.3", "algo.bounding=clip"],                                    # Ψ
    "L": ["algo=dp_fedavg", "p=0.3", "algo.literal_psi=true"],                                 # Ψ's argument
    "M": ["algo=dp_fed_normec", "p=0.3"],                                                      # private
    "N1": ["algo=normec", "algo.beta=0.1"],                                                    # no participation
    "N2": ["algo=normec", "algo.beta=1.0", "algo.gamma=0.01"],
    "O": ["algo=clip21"],                                                                      # Ψ
    "P": ["algo=dp_normec"],                                                                   # private
}


def configs(data_root, runs: dict) -> dict:
    """Each run's config: its algorithm's composed once (Hydra's compose is the slow part), the other overrides set
    on a copy."""
    bases, out = {}, {}
    for name, (algo, *rest) in runs.items():
        if algo not in bases:
            bases[algo] = config(data_root, "backend=stacked", algo)
        out[name] = cfg = copy.deepcopy(bases[algo])
        for override in rest:
            key, value = override.split("=")
            OmegaConf.update(cfg, key, yaml.safe_load(value))
    return out


@pytest.mark.slow
def test_runs_whose_rounds_would_mix_are_never_grouped(tmp_path, data_root):
    """A group steps on its first run's participation draws, local steps, privatizer kind and Ψ: a key that leaves
    any of them out groups runs that must train apart (a sweep over p trained at one p and reported at another).
    The groups of the grid above are exactly the hand-made ones, and a run that declares no scalars (two local
    steps) steps alone."""
    cache, ts = {}, {}
    try:
        for name, cfg in configs(data_root, RUNS).items():
            ts[name] = start(cfg, tmp_path / name, cache)
        names = {id(t): name for name, t in ts.items()}
        grouped, rest = vectorized.groups(list(ts.values()))
        assert sorted(sorted(names[id(t)] for t in g) for g in grouped) == [
            ["A1", "A2"], ["E1", "E2"], ["I1", "I2"], ["N1", "N2"]]
        assert vectorized.group_key(ts["G"]) is None and len(rest) == len(RUNS) - 8
    finally:
        for t in ts.values():
            t.rundir.release()


# Runs that share data, model and seed given together: two pairs that may step as one, and runs of other p, cohort
# and draws' seed beside them (6 rounds of 4 clients: some rounds upload from nobody)
TOGETHER = [["algo=dp_fed_normec", "p=0.3", "algo.beta=0.1"], ["algo=dp_fed_normec", "p=0.3", "algo.beta=0.5"],
            ["algo=dp_fed_normec", "p=0.7", "algo.beta=0.1"], ["algo=dp_fed_normec", "p=0.3", "algo_seed=3"],
            ["algo=dp_fed_normec", "algo.participation=cohort", "algo.cohort_size=1"],
            ["algo=fedavg", "p=0.7", "algo.beta=0.1"], ["algo=fedavg", "p=0.3", "algo.beta=0.5"]]


@pytest.mark.slow
def test_runs_of_different_participation_trained_together_each_upload_from_their_own_draws(tmp_path, data_root):
    """Each run's uploads per round are the participants of its own draws (its p or cohort, its draws' seed),
    counted here from a fresh ``Participation``, and its noise is sized for its own p; a group keyed without the
    participation would train them all on the first run's participants."""
    cfgs = [config(data_root, "backend=stacked", "rounds=6", "eval_every=3", *o) for o in TOGETHER]
    for i in range(len(cfgs)):
        (tmp_path / str(i)).mkdir()
    summaries = train_together([(c, tmp_path / str(i)) for i, c in enumerate(cfgs)])
    assert [s["status"] for s in summaries] == ["completed"] * len(cfgs)
    counts = set()
    for i, cfg in enumerate(cfgs):
        a = cfg.algo
        seed = cfg.seed if cfg.get("algo_seed") is None else cfg.algo_seed
        draws = Participation.of(a.participation, cfg.clients, seed, float(a.p), a.cohort_size)
        own = [int((draws.weights(k) > 0).sum()) for k in range(6)]
        m = pd.read_csv(tmp_path / str(i) / "metrics.csv")
        assert m["transmissions"].tolist()[1:] == own, (i, TOGETHER[i])
        counts.add(tuple(own))
    assert len(counts) == 4                      # p = 0.3 and 0.7, another seed's and a cohort's draws all differ
    std = [s["noise_std"] for s in summaries[:3]]
    assert std[2] == pytest.approx(std[0] * 0.7 / 0.3, rel=1e-6)     # the papers' σ ∝ p: sized for each run's own p

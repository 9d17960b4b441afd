"""Bad input, from the user's side: ``python train.py ...`` run as the user runs it (in this process, through
``train.py`` and Hydra, so the corpus stays cheap: ``tests.helpers.train_here``).

Every refusal must: exit 1 with a message (one line, save where a list of places to look helps) that
names the key (or file and array), the value and what is allowed, and no traceback; and leave the disk
exactly as it was (no directory, no log, no earlier record touched) (``tests.helpers.refused``).
The corpus grows with every refusal class: add a row, never a special case. Run directories (states, locks,
Ctrl-C) are tests/test_run_directory.py's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import CONF, REPO, npz, refused, train_here

SHARED = REPO.parent / "shared" / "data"


def _nan_x():
    x = np.random.default_rng(0).random((200, 1, 8, 8)).astype(np.float32)
    x[3, 0, 1, 1] = np.inf
    return x


# (name, overrides or a function of tmp_path giving them, what the one line must say)
CONFIG = [
    ("rounds negative", ["rounds=-1"], "rounds=-1; allowed: an integer >= 1"),
    ("beta infinite", ["algo.beta=inf"], "algo.beta=inf; allowed: a number > 0, finite"),
    ("gamma nan", ["algo.gamma=nan"], "algo.gamma=nan; allowed: a number > 0, finite"),
    ("alpha infinite", ["algo.alpha=inf"], "algo.alpha=inf; allowed: a number >= 0, finite"),
    ("epsilon infinite", ["algo=dp_normec", "privacy.epsilon=inf"],
     "privacy.epsilon=inf; allowed: a number in (0, 100]"),
    ("epsilon huge", ["algo=dp_normec", "privacy.epsilon=1e308"],
     "privacy.epsilon=1e+308; allowed: a number in (0, 100]"),
    ("seed beyond 64 bits", ["seed=18446744073709551617"],
     "seed=18446744073709551617; allowed: an integer in [0, 2^32)"),
    ("algo seed negative", ["algo_seed=-1"], "algo_seed=-1; allowed: null (seed) or an integer in [0, 2^32)"),
    ("p ignored", ["algo=normec", "p=0.5"], "p=0.5; allowed: 1.0 with algo=normec"),
    ("no cuda", ["device=cuda"], "device='cuda'; allowed: auto or cpu"),
    ("npz without path", ["dataset=npz"], "dataset.path='???'; allowed: the path of an .npz file"),
    ("npz not there", ["dataset=npz", "dataset.path=no-such.npz"],
     "dataset.path='no-such.npz'; allowed: an existing .npz file (relative to the working directory, "),
    ("npz not at home", ["dataset=npz", "dataset.path='~/no-such.npz'"],       # ~ expanded, as the checks read it
     f"dataset.path='{Path.home()}/no-such.npz'; allowed: an existing .npz file\n"),
    ("hidden width", ["model=mlp", "model.hidden=[0]"], "model.hidden=[0]; allowed: a list of integers >= 1 with "
     "model=mlp"),
    ("hidden width not a list", ["model=mlp", "model.hidden=300"], "model.hidden=300; allowed: a list of integers"),
    ("hidden width a list for the cnn", ["model=cnn", "model.hidden=[64]"],
     "model.hidden=[64]; allowed: an integer >= 1 with model=cnn"),
    ("no bounding", ["algo=dp_fedavg", "algo.bounding=none"], ("algo.bounding", "norm or clip")),
    ("epsilon without delta", ["privacy.delta=null"], ("privacy.delta", "(0, 1)")),
    ("cohort too large", ["algo=fedavg", "algo.participation=cohort", "algo.cohort_size=20"],
     ("algo.cohort_size", "clients=4")),
    ("clients beyond samples", ["clients=5000"], ("clients", "2000 training samples")),
    ("clip21 has no SN", ["algo=clip21", "+algo.server_norm=true"],
     "algo.server_norm=True; allowed: the keys of algo=clip21: beta, gamma, name, private"),
    ("resume not a bool", ["resume=maybe"], ("resume", "True | False")),
    ("IG on unequal shards", ["algo=fed_normec", "algo.local_operator=ig", "partition=dirichlet"],
     ("algo.local_operator", "equal shard")),
    ("bf16 on vmap", ["precision=bf16", "backend=vmap"], ("precision", "backend=sequential")),
    ("memory format", ["memory_format=nhwc"], "memory_format='nhwc'; allowed: auto | channels_last | contiguous"),
    ("memory format null", ["memory_format=null"], "memory_format=None; allowed: auto | channels_last | contiguous"),
    ("capture null", ["capture=null"], ("capture", "auto | on | off")),
    ("analytic CNN", ["model=cnn", "backend=analytic"], ("backend='analytic'", "model=cnn", "mlp, logreg")),
    ("a partition's key on another partition", ["+partition.alpha=0.1"],
     "partition.alpha=0.1; allowed: the keys of partition=iid: none"),
    ("misspelled key", ["rouns=3"], "rouns=3; allowed: a key of conf/config.yaml or a config group: accountant, algo,"),
    ("misspelled key of the algorithm", ["algo.gama=3"],             # Hydra's own answer was: use +algo.gama=3
     "algo.gama=3; allowed: the keys of algo=normec: alpha, beta, gamma, name, private, server_norm"),
    ("privacy key misspelt", ["+privacy.epsilonn=2"], ("privacy.epsilonn=2", "the keys of privacy: ", "epsilon,")),
    ("model key", ["+model.depth=20"], "model.depth=20; allowed: the keys of model=logreg: init"),
    ("top-level key misspelt", ["+eval_evry=5"], ("eval_evry=5", "a key of conf/config.yaml", "eval_every,")),
    ("a string for a flag", ["algo.server_norm=maybe"], "algo.server_norm='maybe'; allowed: True | False"),
    ("mean of another length", ["dataset.mean=[0.5,0.5]"], "dataset.mean=[0.5, 0.5]; allowed: as many numbers as "
     "dataset.std (1)"),
    ("std of zero", ["dataset.std=[0]"], "dataset.std=[0]; allowed: a list of numbers > 0"),
    ("cohort size without a cohort", ["algo=fedavg", "algo.cohort_size=2"],
     "algo.cohort_size=2; allowed: null with algo.participation=bernoulli"),
    ("p with a cohort", ["algo=fed_normec", "algo.participation=cohort", "algo.cohort_size=2", "p=0.5"],
     "algo.p=0.5; allowed: 1.0 with algo.participation=cohort"),
    ("p too small for its weights", ["algo=fed_normec", "p=1e-300"],      # 1/p in float32 was NaN: "diverged"
     "p=1e-300; allowed: a number in [1e-30, 1]"),
    ("split seed null", ["dataset.split=holdout", "dataset.split_seed=null"],
     "dataset.split_seed=None; allowed: an integer in [0, 2^32)"),
    ("mean for colour images", ["dataset.mean=[0.5,0.5,0.5]", "dataset.std=[0.5,0.5,0.5]"],
     "dataset.mean=[0.5, 0.5, 0.5]; allowed: 1 number (the data has 1 channel)"),
    # privacy keys the run does not read are refused, not ignored
    ("privacy without noise", ["algo=normec", "privacy.epsilon=0.5"],
     "privacy.epsilon=0.5; allowed: 8.0 with algo=normec, which adds no noise"),
    ("accountant without noise", ["algo=normec", "privacy.calibration=accountant", "accountant=rdp"],
     "accountant='rdp'; allowed: paper with algo=normec, which adds no noise"),
    ("a budget without noise", ["algo=normec", "budget=e175_r177"], "privacy.epsilon=1.75; allowed: 8.0"),
    ("formula key under an accountant", ["algo=dp_normec", "privacy.calibration=accountant", "accountant=rdp",
                                         "privacy.c=3"],
     "privacy.c=3; allowed: 1.0 with privacy.calibration=accountant"),
    ("amplification without sampling", ["algo=dp_normec", "privacy.amplification=true"],
     "privacy.amplification=True; allowed: false with algo=dp_normec at p=1"),
    ("formula key for DP-SGD", ["algo=dpfl", "privacy.c=2"],
     "privacy.c=2; allowed: 1.0 with algo=dpfl, whose mechanism reads privacy.epsilon and delta alone"),
    ("noise multiplier beyond accounting", ["algo=dp_normec", "privacy.noise_multiplier_override=1e300"],
     "privacy.noise_multiplier_override=1e+300; allowed: null or a number in [0, 1e+06]"),
    # keys of a group's option that nothing reads
    ("audit key misspelt", ["+audit.canary=4"], "audit.canary=4; allowed: the keys of audit: canaries, mode"),
    ("logger key of another logger", ["+logger.project=foo"], "logger.project='foo'; allowed: the keys of logger=csv"),
    ("device key", ["+device.index=1"], "device.index=1; allowed: the keys of device=cpu: name"),
    ("dataset key misspelt", ["+dataset.trian_limit=5"], "dataset.trian_limit=5; allowed: the keys of dataset="),
    ("wandb project not a name", ["logger=wandb", "logger.mode=disabled", "logger.project=a/b"],
     "logger.project='a/b'; allowed: a name without"),
    # an algorithm's key that its setting leaves unread
    ("tau of ALI-DPFL", ["algo=ali_dpfl", "algo.tau=5"], "algo.tau=5; allowed: 1 with algo.adaptive=true"),
    ("full gradient for DP-SGD", ["algo=dpfl", "oracle=full"], "oracle='full'; allowed: minibatch with algo=dpfl"),
    ("local steps of an incremental pass", ["algo=fed_normec", "algo.local_operator=ig", "algo.local_steps=5"],
     "algo.local_steps=5; allowed: 1 with algo.local_operator=ig"),
    ("central noise without noise", ["algo=fedavg", "algo.noise_by=server"],
     "algo.noise_by='server'; allowed: client with algo.private=false"),
    ("quantizer levels without a mechanism", ["algo=normfedavg", "algo.s=64"],
     "algo.s=64; allowed: 4096 with algo.mechanism=none"),
    ("schedule of a repeated round", ["algo=dp_normfedavg", "algo.beta=[[0,0.1],[0,5.0]]"],
     "algo.beta=[[0, 0.1], [0, 5.0]]; allowed: a list of [k_start, value] pairs, distinct"),
    ("holdout of the standard split", ["dataset.holdout_fraction=0.5"],
     "dataset.holdout_fraction=0.5; allowed: 0.1 with dataset.split=standard"),
    ("batch of a full gradient", ["oracle=full", "batch_size=7"], "batch_size=7; allowed: 32 with oracle=full"),
    ("tf32 on a CPU", ["precision=tf32"], "precision='tf32'; allowed: fp32 or bf16 on cpu"),
    ("threads beyond the cores", ["threads=100000"], "threads=100000; allowed: null or an integer in [1, "),
    ("data root null", ["data_root=null"], "data_root=None; allowed: a directory's path"),
    ("data nowhere", ["data_root=/nonexistent/root", "offline_data=/nonexistent/none", "dataset.download=false"],
     ("Fashion-MNIST not found", "To provide Fashion-MNIST")),
]
NPZ = [  # (name, the file's arrays or raw bytes, what the line must say)
    ("nan features", dict(x=_nan_x()), "x: 1 values are NaN or infinite"),
    ("label of a million", dict(y=np.r_[10**6, np.zeros(199, int)]), "y: label 1000000; allowed: class labels 0..999"),
    ("negative label", dict(y=np.r_[-1, np.zeros(199, int)]), "y: value -1; allowed: integers >= 0"),
    ("empty test split", dict(x_test=np.zeros((0, 1, 8, 8), np.float32), y_test=np.zeros(0, int)),
     "x_test: shape (0, 1, 8, 8); allowed: one sample per row"),
    ("1-D x", dict(x=np.zeros(200, np.float32), x_test=np.zeros(50, np.float32)), "x: shape (200,)"),
    ("labels of another length", dict(y=np.zeros(10, int)), "y: int64 (10,); allowed: integers of shape (200,)"),
    ("empty file", b"", "the file: empty (0 bytes)"),
    ("text file", b"x,y\n1,2\n", "the file: not an .npz (it begins b'x,y\\n')"),
    ("truncated", "truncated", "the file: not a readable .npz (BadZipFile"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, overrides, expect", CONFIG, ids=[c[0] for c in CONFIG])
def test_bad_config_values(name, overrides, expect, tmp_path, data_root):
    refused(tmp_path, data_root, overrides, expect)


def test_a_misspelled_key_in_a_sweep_is_refused_as_typed_and_other_hydra_errors_stay_hydra_s():
    from normfl.run.cli import unknown_key

    assert unknown_key("algo.gama", ["-m", "experiment=alidpfl_fmnist", "algo.gama=0.1,1", "seed=1,2"]) == (
        "invalid config: algo.gama=0.1,1; allowed: the keys of algo=ali_dpfl: T_mode, adaptive, clip, divisor, "
        "lambda_const, lr, name, omega_const, rc_method, rc_override, sample_rate, sigma, tau, tau_cap, tau_rule")
    assert unknown_key("algo.nme", ["-m", "algo.nme=abc,def"]).startswith("invalid config: algo.nme=abc,def; ")
    assert unknown_key("hydra.foo", ["hydra.foo=1"]) is None          # Hydra's message names Hydra's keys


@pytest.mark.parametrize("launcher, expect", [([], 4), (["hydra/launcher=joblib"], 4), (["hydra/launcher=slurm"], 0)])
def test_a_sweeps_refused_jobs_are_named_before_any_job_starts(launcher, expect):
    """A local sweep lists the jobs its validation will refuse before it starts any (the grid of an experiment's
    sweeper params with a value of the command line over it: 4 β x 2 γ, γ = -2 refused in jobs 1, 3, 5, 7); on
    SLURM the jobs run on other machines, whose cores and devices the sweep's own machine cannot judge."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from normfl.run.sweep import refusals, sweep_jobs

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=normec_np_dpsgd", *launcher], return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.overrides.task = ["experiment=normec_np_dpsgd", "algo.gamma=0.1,-2", *launcher]
        found = refusals(cfg, sweep_jobs(cfg))
    assert [num for num, *_ in found] == [1, 3, 5, 7][:expect]
    assert all(str(err) == "invalid config: algo.gamma=-2; allowed: a number > 0, finite" and "algo.gamma=-2" in o
               for _, o, err in found)


@pytest.mark.parametrize("name, content, expect", NPZ, ids=[c[0] for c in NPZ])
def test_bad_npz_contents(name, content, expect, tmp_path, data_root):
    path = tmp_path / "data.npz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "truncated":
        path.write_bytes(npz(path).read_bytes()[:3000])
    else:
        npz(path, **content)
    line = refused(tmp_path, data_root, ["dataset=npz", f"dataset.path={path}"], expect)
    assert str(path) in line


@pytest.mark.parametrize("model, x, expect", [
    ("cnn", None, "model='cnn'; allowed: a model for inputs of shape (1, 8, 8) (it raised: Calculated padded"),
    ("resnet20", np.zeros((200, 20), np.float32), "model='resnet20'; allowed: a model for inputs of shape (20,)"),
])
def test_a_model_that_cannot_take_the_data(model, x, expect, tmp_path, data_root):
    """A 5x5 convolution on 8x8 images, or flat features into a convolution, raised torch's RuntimeError as a
    traceback and left a failed run behind, which then held the directory against the corrected command."""
    path = npz(tmp_path / "data.npz", **({} if x is None else {"x": x, "x_test": x[:50]}))
    refused(tmp_path, data_root, ["dataset=npz", f"dataset.path={path}", f"model={model}"], expect)


def test_bad_environment(tmp_path, data_root, monkeypatch):
    monkeypatch.setenv("NORMFL_OFFLINE_DATA", str(tmp_path / "nowhere"))
    refused(tmp_path, data_root, [], "offline_data (from $NORMFL_OFFLINE_DATA)")


def test_a_logger_whose_package_is_missing(tmp_path, data_root, monkeypatch):
    """A machine without wandb (a bare GPU box): logger=wandb is refused up front, not mid-run."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    refused(tmp_path, data_root, ["logger=wandb"], ("logger='wandb'", "the wandb package is not installed"))


@pytest.mark.slow
def test_wandb_online_without_a_login(tmp_path, data_root, monkeypatch):
    """``logger.mode=online`` with no wandb login raised wandb's UsageError after the run was accepted and left a
    failed run in the directory; now it is refused and nothing is left."""
    pytest.importorskip("wandb")
    home = tmp_path / "home"                    # no ~/.netrc, no wandb settings
    home.mkdir()
    for var in ("WANDB_API_KEY", "WANDB_CONFIG_DIR", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_DIR", str(home))
    code, err = train_here(data_root, tmp_path / "run", "logger=wandb", "logger.mode=online")
    assert code == 1 and "logger.mode='online'; allowed: offline or disabled, or online once logged in" in err, err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_canaries_that_would_not_fit_in_memory(tmp_path, data_root, monkeypatch):
    """``audit.canaries=100000`` on logistic regression was killed at 20 GB; on a machine of 1 GiB (pretended
    here), 10,000 canary directions of 7,850 coordinates (2.3 GiB) are refused with the most that fit."""
    from normfl.privacy.audit import canaries

    pages = {"SC_PHYS_PAGES": 2**18, "SC_PAGE_SIZE": 4096}               # 1 GiB
    monkeypatch.setattr(canaries.os, "sysconf", lambda name: pages[name])
    refused(tmp_path, data_root, ["algo=dp_normec", "audit.canaries=10000"],
            "audit.canaries=10000; allowed: an even integer <= 2136 here: 10000 canary directions of 7850 coordinates")


def test_corrupted_archive_is_named_by_its_checksum(tmp_path):
    offline = tmp_path / "offline"
    offline.mkdir()
    archive = (SHARED / "cifar10-jpeg.tar.xz").read_bytes()
    (offline / "cifar10-jpeg.tar.xz").write_bytes(archive[: len(archive) // 2])      # truncated
    shutil.copy(SHARED / "cifar10-canonical-labels.npz", offline)
    area = tmp_path / "runs"             # the data root below is a cache, locked while it is filled
    area.mkdir()
    line = refused(area, tmp_path / "root", ["dataset=cifar10", "model=logreg", "rounds=1",
                                             f"offline_data={offline}"], "corrupted or truncated")
    assert "cifar10-jpeg.tar.xz: sha256" in line


def test_a_data_root_that_cannot_be_made(tmp_path, data_root):
    """The loader's mkdir under a file said only "[Errno 20] Not a directory"; now the key is named."""
    (tmp_path / "a-file").write_text("mine")
    refused(tmp_path, data_root, [f"data_root={tmp_path / 'a-file' / 'data'}"],
            f"data_root='{tmp_path / 'a-file' / 'data'}'; allowed: a directory normfl can make and write")


def _strict(name):
    raise ValueError(f"{name} in a summary: not strict JSON")


def test_non_finite_evaluation_is_divergence_and_summaries_are_strict_json(tmp_path, data_root):
    """Defect 4: γ = 1e38 leaves the parameters finite but the test loss NaN: recorded as diverged, with no
    final accuracy, and a summary any strict JSON parser reads."""
    d = tmp_path / "run"
    assert train_here(data_root, d, "algo.gamma=1e38", "rounds=1")[0] == 0
    summary = json.loads((d / "summary.json").read_text(), parse_constant=_strict)
    assert summary["status"] == "diverged"
    assert summary["final_test_acc"] is None and summary["final_test_loss"] is None
    assert summary["best_round"] == 0                       # the only evaluation that gave a number


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_a_calibrated_run_never_spends_more_than_asked(accountant, tmp_path, data_root):
    """Defect 8, from the user's side: the ε a run certifies for its noise is at most the ε it was given."""
    d = tmp_path / "run"
    assert train_here(data_root, d, "algo=dp_normec", "privacy.calibration=accountant", f"accountant={accountant}",
                      "privacy.epsilon=1")[0] == 0
    privacy = json.loads((d / "summary.json").read_text())["privacy"]
    assert privacy["target_epsilon"] == 1 and 0.99 < privacy[f"epsilon_{accountant}"] <= 1


def test_the_private_algorithms_a_refusal_names_are_those_whose_runs_add_noise():
    """A privacy key refused for a run without noise names the private algorithms: read from what each algorithm
    option's runs do (``private``), so an option added, or its noise switched, is named or dropped with it; an
    option private only with its switch is named with it, unless another option of its class adds noise as it
    is (clip21's is dp_clip21)."""
    from normfl.config.privacy_rules import private, private_algos
    from tests.helpers import composed

    named = dict(item.partition(" with ")[::2] for item in private_algos().split(", "))
    options = sorted(p.stem for p in (CONF / "algo").glob("*.yaml"))
    noisy = {name for name in options if private(composed(f"algo={name}"))}
    assert set(named) - noisy == {name for name, switch in named.items() if switch}
    assert noisy <= set(named) and named["dpsgd_norm"] == "algo.private=true"
    for name, switch in named.items():
        assert private(composed(f"algo={name}", *(["algo.private=true"] if switch else [])))
    assert "normec" not in named and "clip21" not in named and named["dp_normec"] == ""

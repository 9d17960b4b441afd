"""``python -m normfl.collect --plot`` draws a figure a paper can take (issue 67.2): no title unless asked, a legend
that names each algorithm as its reader does and only the keys that differ between the runs that read them, inside
the axes where it fits, one colour per algorithm the same in every figure, vector files; and its table shows a key
only where the runs that read it differ. On run folders made here (config, summary, metrics), so without training."""

import copy
import functools
import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

import normfl.collect as collect_module
from normfl.collect import main
from tests.helpers import REPO, composed, rows


@functools.cache
def _base(algo: str):
    return composed(f"algo={algo}", "dataset=fashion_mnist", "model=mlp")


def fabricate(d: Path, algo: str, keys: dict | None = None, accuracy: float = 0.6, drop: tuple = ()) -> Path:
    """A finished run of ``algo`` with ``keys`` set and the ``algo`` keys ``drop`` left out of its config: three
    evaluations ending at ``accuracy``."""
    cfg = copy.deepcopy(_base(algo))
    for k, v in (keys or {}).items():
        OmegaConf.update(cfg, k, v, force_add=True, merge=False)
    data = OmegaConf.to_container(cfg)
    for k in drop:
        del data["algo"][k]
    (d / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(data), d / ".hydra" / "config.yaml")
    (d / "summary.json").write_text(json.dumps({
        "status": "completed", "final_round": 4, "final_test_acc": accuracy, "best_test_acc": accuracy,
        "last5_mean_test_acc": accuracy, "best_round": 4, "wall_time_s": 1.0}))
    pd.DataFrame({"round": [0, 2, 4], "train_loss": [None, 1.0, accuracy], "test_acc": [0.1, accuracy / 2, accuracy]}
                 ).to_csv(d / "metrics.csv", index=False)
    return d


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> Path:
    """α-NormEC (γ = 0.1) and Clip21 (γ = 1), three seeds each: the issue's comparison."""
    root = tmp_path_factory.mktemp("comparison")
    for algo, gamma in (("normec", 0.1), ("clip21", 1.0)):
        for seed in (1, 2, 3):
            fabricate(root / f"{algo}-{seed}", algo, {"algo.gamma": gamma, "seed": seed}, accuracy=0.5 + seed / 20)
    return root


@pytest.fixture
def drawn(monkeypatch) -> list:
    """The figures ``plot`` draws, each written as it would be."""
    figures, save = [], collect_module.save
    monkeypatch.setattr(collect_module, "save", lambda fig, *a, **k: figures.append(fig) or save(fig, *a, **k))
    return figures


def test_the_table_shows_a_key_only_where_the_runs_that_read_it_differ(comparison, tmp_path, capsys):
    """α and server_norm are α-NormEC's keys alone: one algorithm's setting is no difference from another that has
    no such key; α differs once two α-NormEC runs differ in it (empty for Clip21); and a key a config lacks that its
    algorithm takes is still read (at its KEY_DEFAULTS value), so such a run is not folded with one that sets it."""
    main([str(comparison)])
    table = rows(capsys.readouterr().out)
    assert [(r["algo.name"], r["algo.gamma"], r["n"]) for r in table] == [("clip21", "1", "3"), ("normec", "0.1", "3")]
    assert not {"algo.alpha", "algo.server_norm"} & set(table[0])
    other = fabricate(tmp_path / "alpha", "normec", {"algo.gamma": 0.1, "algo.alpha": 0.1, "seed": 1})
    main([str(comparison), str(other)])
    table = rows(capsys.readouterr().out)
    assert [(r["algo.name"], r["algo.alpha"], r["n"]) for r in table] == [
        ("clip21", "–", "3"), ("normec", "0.01", "3"), ("normec", "0.1", "1")]
    fabricate(tmp_path / "sn/off", "normec", {"algo.server_norm": False, "seed": 1})
    fabricate(tmp_path / "sn/absent", "normec", {"seed": 2}, drop=("server_norm",))
    main([str(tmp_path / "sn")])
    assert [r["n"] for r in rows(capsys.readouterr().out)] == ["1", "1"]


@pytest.mark.slow
def test_the_legend_names_each_algorithm_as_its_reader_does_and_only_what_differs(comparison, tmp_path, drawn,
                                                                                  monkeypatch):
    """The issue's figure: 'Clip21, γ=1' and 'α-NormEC, γ=0.1', not 'algo=NormEC, name=normec, alpha=0.01,
    server_norm=True (n = 3)'; the seeds said once; axes by what they count. An algorithm's name is its class's
    (DP- where it adds noise); a user's own class declares none (its class's name), or does not import here (its
    config's name)."""
    main([str(comparison), "--plot", str(tmp_path / "c.png"), "--metric", "test_error"])
    ax = drawn[0].axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["Clip21, γ=1", "α-NormEC, γ=0.1"]
    assert legend.get_title().get_text() == "mean ± std of 3 seeds"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("communication round", "test error (%)")
    main([str(comparison), "--by", "algo.alpha", "--plot", str(tmp_path / "c.png")])     # Clip21 has no α
    assert [t.get_text() for t in drawn[1].axes[0].get_legend().get_texts()] == ["α-NormEC, γ=0.1", "Clip21, γ=1"]
    monkeypatch.syspath_prepend(str(REPO / "docs" / "own-algorithm"))
    same = {"algo.beta": 0.1, "algo.gamma": 0.1, "seed": 1}
    fabricate(tmp_path / "mixed/plain", "normec", same)
    fabricate(tmp_path / "mixed/dp", "dp_normec", same)
    fabricate(tmp_path / "mixed/own", "normec", {**same, "algo": {"_target_": "fedavgm.FedAvgM", "name": "dp_fedavgm",
                                                                  "gamma": 0.1, "beta": 0.1, "private": True}})
    fabricate(tmp_path / "mixed/away", "normec", {**same, "algo._target_": "nowhere.Mine", "algo.name": "mine"})
    main([str(tmp_path / "mixed"), "--plot", str(tmp_path / "c.png")])
    assert [t.get_text() for t in drawn[2].axes[0].get_legend().get_texts()] == [
        "DP-FedAvgM", "DP-α-NormEC", "α-NormEC", "mine"]


def test_one_colour_per_algorithm_whatever_runs_a_figure_holds(tmp_path, drawn):
    """Two figures of one comparison, the second without the DP-SGD baseline: α-NormEC and Clip21 keep their
    colours; each algorithm has its own, its settings told apart by the line; a figure of one algorithm colours its
    settings."""
    for algo, betas in (("normec", (0.1, 1.0)), ("clip21", (0.1,)), ("dpsgd_norm", (0.1,))):
        for beta in betas:
            fabricate(tmp_path / f"{algo}-{beta}", algo, {"algo.beta": beta, "algo.gamma": 0.1})
    for name, paths in (("a", ["normec-0.1", "normec-1.0", "clip21-0.1", "dpsgd_norm-0.1"]),
                        ("b", ["normec-0.1", "clip21-0.1"]), ("c", ["normec-0.1", "normec-1.0"])):
        main([*(str(tmp_path / p) for p in paths), "--plot", str(tmp_path / f"{name}.png")])
    every, some, one = ({t.get_text(): (line.get_color(), line.get_linestyle())
                         for t, line in zip(f.axes[0].get_legend().get_texts(), f.axes[0].lines, strict=True)}
                        for f in drawn)
    assert set(every) == {"Clip21, β=0.1", "SGD with Norm_α, β=0.1", "α-NormEC, β=0.1", "α-NormEC, β=1"}
    assert some == {"Clip21": every["Clip21, β=0.1"], "α-NormEC": every["α-NormEC, β=0.1"]}
    assert len({c for c, _ in every.values()}) == 3 and every["α-NormEC, β=1"][0] == every["α-NormEC, β=0.1"][0]
    assert every["α-NormEC, β=1"][1] != every["α-NormEC, β=0.1"][1]
    assert len({c for c, _ in one.values()}) == 2


@pytest.mark.slow
def test_the_legend_sits_inside_the_axes_where_it_fits_else_beside_them_in_the_figure(comparison, tmp_path, drawn):
    """Two curves: the legend inside the axes. Twenty settings with long names: beside them, wrapped, the figure
    grown to hold it."""
    import warnings

    main([str(comparison), "--plot", str(tmp_path / "c.png")])
    fig = drawn[0]
    fig.canvas.draw()
    box, axes = fig.axes[0].get_legend().get_window_extent(), fig.axes[0].get_window_extent()
    assert axes.x0 <= box.x0 and box.x1 <= axes.x1 and axes.y0 <= box.y0 and box.y1 <= axes.y1
    for i in range(20):
        fabricate(tmp_path / "many" / str(i), "normec", {
            "algo.beta": i / 8, "data_root": f"warmup_then_cosine_decay_over_{i}_rounds",
            "dataset._target_": f"normfl.data.load_{'cifar10' if i < 10 else 'fashion_mnist'}"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")                          # "Tight layout not applied" among them
        by = "algo.beta,dataset._target_,data_root"
        main([str(tmp_path / "many"), "--by", by, "--plot", str(tmp_path / "m.png")])
    fig = drawn[1]
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[0] == "β=0, dataset=load_cifar10,\ndata_root=warmup_then_cosine_decay_over_0_rounds"
    fig.canvas.draw()
    box, axes, page = fig.axes[0].get_legend().get_window_extent(), fig.axes[0].get_window_extent(), fig.bbox
    assert axes.x1 < box.x0 and page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1


def test_no_title_unless_asked(comparison, tmp_path, drawn):
    main([str(comparison), "--plot", str(tmp_path / "c.png")])
    main([str(comparison), "--plot", str(tmp_path / "c.png"), "--title", "Fashion-MNIST, MLP, 10 clients"])
    untitled, titled = drawn
    assert untitled._suptitle is None and not untitled.axes[0].get_title()
    assert titled._suptitle.get_text() == "Fashion-MNIST, MLP, 10 clients"


@pytest.mark.slow
def test_a_figure_is_a_vector_file_the_same_at_every_draw(comparison, tmp_path):
    """.svg and .pdf as asked, byte-identical when drawn again (no date, no random ids)."""
    for suffix, head in ((".svg", b"<?xml"), (".pdf", b"%PDF")):
        first, second = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
        main([str(comparison), "--plot", str(first)])
        main([str(comparison), "--plot", str(second)])
        assert first.read_bytes().startswith(head) and first.read_bytes() == second.read_bytes(), suffix


def test_a_loss_curves_first_point_far_above_the_rest_is_left_off_the_scale_and_said(tmp_path, drawn):
    """ResNet20 with BatchNorm starts at test loss 55 (round 0, its initial running statistics): plotted as it is,
    that one point sets the scale and the curve is all spike. The axis ends above the other points and a note says
    where the first is; a curve whose first point is not far above keeps its scale."""
    for name, first in (("spike", 55.0), ("plain", 2.5)):
        run = fabricate(tmp_path / name / "run", "normec")
        pd.DataFrame({"round": [0, 1, 2], "test_loss": [first, 2.0, 1.5], "test_acc": [0.1, 0.3, 0.4]}).to_csv(
            run / "metrics.csv", index=False)
        main([str(tmp_path / name), "--metric", "test_loss", "--plot", str(tmp_path / f"{name}.png")])
    spike, plain = (f.axes[0] for f in drawn)
    assert spike.get_ylim()[1] == pytest.approx(3.0) and [t.get_text() for t in spike.texts] == \
        ["at 0: 55, above the axis"]
    assert plain.get_ylim()[1] >= 2.5 and not plain.texts

"""normfl.reproduce: the papers' printed numbers (paper_numbers.csv) and their loader."""

import math
import re

import pytest

from normfl.reproduce import KEY_COLUMNS, paper_numbers, paper_value, param_label

FM = "fashion_mnist"
ID_RE = re.compile(r"^(NORMEC|FEDNORMEC|NORMFEDAVG|ALIDPFL)-(T|F|EX|APP)[A-Z0-9]*$")


@pytest.fixture(scope="module")
def df():
    return paper_numbers()


def test_columns_and_dtypes(df):
    assert list(df.columns) == ["id", "dataset", "block", "row", "column", "metric", "value", "std", "source", "note"]
    assert df["value"].dtype == "float64" and df["std"].dtype == "float64"
    for c in ("id", "dataset", "block", "row", "column", "metric", "source", "note"):
        assert df[c].map(lambda x: isinstance(x, str)).all(), c


def test_ids_match_the_scheme(df):
    bad = sorted({i for i in df["id"] if not ID_RE.match(i)})
    assert not bad, bad


def test_keys_are_unique(df):
    dup = df[df.duplicated(list(KEY_COLUMNS), keep=False)]
    assert dup.empty, dup[list(KEY_COLUMNS)].to_string()


def test_every_row_is_filled_in(df):
    assert df["value"].notna().all()  # qualitative tables are omitted, so every row has a number
    assert (df["metric"] != "").all() and (df["source"] != "").all()
    assert df["dataset"].isin(["cifar10", "fashion_mnist", ""]).all()
    assert (df["std"].dropna() > 0).all()
    # std is printed only in DP-NormFedAvg's tables, and there for every test error
    has_std = df["std"].notna()
    assert set(df.loc[has_std, "id"]) == {f"NORMFEDAVG-T{i}" for i in range(2, 7)}
    nfa_err = df["id"].str.startswith("NORMFEDAVG-T") & (df["metric"] == "test_error_pct")
    assert has_std[nfa_err].all()


def test_parameter_labels_follow_the_convention(df):
    # name=value keys write real numbers as Python floats (epsilon=2.0, beta=10.0), tau as an int
    for label in list(df["row"]) + list(df["column"]) + list(df["block"]):
        for part in label.split("|"):
            m = re.fullmatch(r"(epsilon|alpha|beta|gamma|p|clip_C)=([^|]+)", part)
            if m and m.group(2) != "all":
                assert part == param_label(m.group(1), float(m.group(2))), label
    assert param_label("epsilon", 2.0) == "epsilon=2.0"
    assert param_label("tau", 1) == "tau=1"
    assert param_label("s", "2^12") == "s=2^12"


# Expected number of values per id. Tables: every numeric cell. Best-configuration tables (NORMEC-F8,
# T2, F11): 8 rows x (best gamma, final accuracy); beta is the row key. Claims: one per stated number.
EXPECTED_COUNTS = {
    "ALIDPFL-T2": 2 * 6 * 6,  # 2 blocks x 6 methods x (3 epsilons x 2 datasets)
    "ALIDPFL-T3": 6 * 6,
    "ALIDPFL-T4": 6 * 6,
    "ALIDPFL-TEXT6B": 10,  # R_c for the 10 budgets
    "NORMFEDAVG-T2": 3 * 2,  # 3 mechanisms x (t, test error)
    "NORMFEDAVG-T3": 3,
    "NORMFEDAVG-T4": 3 * 2,
    "NORMFEDAVG-T5": 4,
    "NORMFEDAVG-T6": 2 * 2,  # 2 datasets x 2 algorithms
    "NORMFEDAVG-F1": 1,
    "NORMFEDAVG-F3": 1,
    "NORMFEDAVG-F4": 1,
    "NORMFEDAVG-F5": 4,
    "NORMEC-EX1": 2,
    "NORMEC-F2": 1 + 3 * 2 + 2,  # optimum cell, three stated ranges, best alpha/beta
    "NORMEC-F4": 4,  # two peaks, two spreads
    "NORMEC-F8": 8 * 2,
    "NORMEC-T2": 8 * 2,
    "NORMEC-F9": 1,
    "NORMEC-F11": 8 * 2,
    "NORMEC-F12": 4 * 4,
    "FEDNORMEC-F1": 5,
    "FEDNORMEC-F2": 2,
    "FEDNORMEC-F3": 1,
    "FEDNORMEC-F4": 2,
}


def test_counts_per_id(df):
    assert df["id"].value_counts().to_dict() == EXPECTED_COUNTS


def test_table_shapes(df):
    t2 = df[df["id"] == "ALIDPFL-T2"]
    assert sorted(t2["block"].unique()) == ["R_s=2R_c", "R_s=R_c"]
    assert sorted(t2["row"].unique()) == ["ali_dpfl"] + [f"tau={t}" for t in range(1, 6)]
    t4_rows = sorted(df.loc[df["id"] == "ALIDPFL-T4", "row"].unique())
    assert t4_rows == ["ali_dpfl"] + [f"tau={t}" for t in (1, 3, 5, 7, 9)]
    for tid in ("ALIDPFL-T2", "ALIDPFL-T3", "ALIDPFL-T4"):
        t = df[df["id"] == tid]
        assert (t.groupby(["dataset", "block"]).size() == 18).all()  # 6 methods x 3 epsilons
        assert t["value"].between(0, 100).all()
    f12 = df[df["id"] == "NORMEC-F12"]
    assert sorted(f12["row"].unique()) == [f"beta={b!r}" for b in (0.001, 0.01, 0.1, 1.0)]
    assert sorted(f12["column"].unique()) == [f"gamma={g!r}" for g in (0.001, 0.01, 0.1, 1.0)]


@pytest.mark.parametrize(
    ("expected", "std", "id", "filters"),
    [
        (11.21, 0.02, "NORMFEDAVG-T6", dict(dataset=FM, row="normfedavg")),
        (11.53, 0.03, "NORMFEDAVG-T6", dict(dataset=FM, row="fedavg")),
        (46.15, 0.04, "NORMFEDAVG-T6", dict(dataset="cifar10", row="fedavg")),
        (23, None, "NORMFEDAVG-T4", dict(row="bin_s=2^12", column="t")),
        (14, None, "NORMFEDAVG-T4", dict(row="qtdl_s=2^12", column="t")),
        (8, None, "NORMFEDAVG-T4", dict(row="qtdl_s=2^6", column="t")),
        (20.82, 0.04, "NORMFEDAVG-T4", dict(row="bin_s=2^12", column="test_error_last5")),
        (17.31, 0.06, "NORMFEDAVG-T4", dict(row="qtdl_s=2^12", column="test_error_last5")),
        (17.24, 0.09, "NORMFEDAVG-T4", dict(row="qtdl_s=2^6", column="test_error_last5")),
        (35, None, "NORMFEDAVG-T2", dict(row="bin_s=2^20", metric="bits_per_coord")),
        (53.63, 0.11, "NORMFEDAVG-T2", dict(row="qtdl_s=2^20", metric="test_error_pct")),
        (29.59, 0.15, "NORMFEDAVG-T3", dict(row="dp_normfedavg")),
        (42.92, 0.06, "NORMFEDAVG-T3", dict(row="clip_C=1.0")),
        (53.65, 0.05, "NORMFEDAVG-T5", dict(row="clip_C=0.25")),
        (82.02, None, "ALIDPFL-T2", dict(dataset=FM, block="R_s=R_c", row="ali_dpfl", column="epsilon=1.75")),
        (82.58, None, "ALIDPFL-T2", dict(dataset=FM, block="R_s=2R_c", row="ali_dpfl", column="epsilon=1.75")),
        (26.38, None, "ALIDPFL-T2", dict(dataset="cifar10", block="R_s=2R_c", row="tau=5", column="epsilon=1.55")),
        (83.46, None, "ALIDPFL-T3", dict(dataset=FM, row="tau=2", column="epsilon=2.5")),
        (54.76, None, "ALIDPFL-T4", dict(dataset="cifar10", row="tau=9", column="epsilon=3.75")),
        (71.13, None, "ALIDPFL-T4", dict(dataset=FM, row="tau=9", column="epsilon=3.25")),
        (1585, None, "ALIDPFL-TEXT6B", dict(column="epsilon=3.75")),
        (317, None, "ALIDPFL-TEXT6B", dict(column="epsilon=2.0")),
        (82.86, None, "NORMEC-T2", dict(block="normec_sn", row="beta=0.01", column="final_accuracy")),
        (0.01, None, "NORMEC-T2", dict(block="normec_sn", row="beta=0.01", column="gamma")),
        (86.09, None, "NORMEC-T2", dict(block="normec_no_sn", row="beta=0.1", column="final_accuracy")),
        (0.01, None, "NORMEC-T2", dict(block="normec_no_sn", row="beta=10.0", metric="best_gamma")),
        (51.10, None, "NORMEC-F8", dict(block="dpsgd_norm", row="beta=0.01", column="final_accuracy")),
        (83.19, None, "NORMEC-F11", dict(block="clip21", row="beta=10.0", column="final_accuracy")),
        (65.57, None, "NORMEC-F12", dict(row="beta=0.01", column="gamma=0.1")),
        (25.09, None, "NORMEC-F12", dict(row="beta=0.001", column="gamma=1.0")),
        (85.78, None, "NORMEC-F2", dict(row="beta=0.1", column="alpha=0.1")),
        (77.56, None, "NORMEC-F4", dict(block="no_sn", metric="highest_test_accuracy_pct")),
        (72.21, None, "NORMEC-F4", dict(block="with_sn", metric="highest_test_accuracy_pct")),
        (70, None, "FEDNORMEC-F1", dict(block="p=1.0", row="beta=0.01")),
        (1200, None, "FEDNORMEC-F2", dict(row="p=0.25")),
        (0.1, None, "FEDNORMEC-F4", dict(metric="best_beta")),
    ],
)
def test_spot_values(df, expected, std, id, filters):
    assert paper_value(id, **filters) == pytest.approx(expected, abs=1e-12)
    mask = df["id"] == id
    for k, v in filters.items():
        mask &= df[k] == v
    got_std = df.loc[mask, "std"].item()
    assert math.isnan(got_std) if std is None else got_std == pytest.approx(std, abs=1e-12)


def test_claims_agree_with_the_tables_they_summarise():
    # NFA captions: "more than 3% / 3.5% / 0.5%", "0.3%", "approximately 0.1%"
    def err(table, row, dataset=None):
        return paper_value(table, dataset=dataset, row=row, metric="test_error_pct")

    assert err("NORMFEDAVG-T2", "bin_s=2^20") - err("NORMFEDAVG-T2", "qtdl_s=2^9") > paper_value("NORMFEDAVG-F1")
    assert err("NORMFEDAVG-T4", "bin_s=2^12") - err("NORMFEDAVG-T4", "qtdl_s=2^6") > paper_value("NORMFEDAVG-F3")
    assert err("NORMFEDAVG-T5", "clip_C=0.25") - err("NORMFEDAVG-T5", "dp_normfedavg") > paper_value("NORMFEDAVG-F4")
    for dataset, better, worse in [(FM, "normfedavg", "fedavg"), ("cifar10", "fedavg", "normfedavg")]:
        gap = err("NORMFEDAVG-T6", worse, dataset) - err("NORMFEDAVG-T6", better, dataset)
        claim = paper_value("NORMFEDAVG-F5", dataset=dataset, row=better, metric="test_error_reduction_pct")
        assert gap == pytest.approx(claim, abs=0.05)

    # NORMEC: "SN improves ... by approximately 2.2%" at beta = 10; the no-SN rows are the same in F8, T2, F11
    def acc(table, block, row):
        return paper_value(table, block=block, row=row, column="final_accuracy")

    gain = acc("NORMEC-T2", "normec_sn", "beta=10.0") - acc("NORMEC-T2", "normec_no_sn", "beta=10.0")
    assert gain == pytest.approx(paper_value("NORMEC-F9"), abs=0.05)
    for beta in ("beta=0.01", "beta=0.1", "beta=1.0", "beta=10.0"):
        for column in ("gamma", "final_accuracy"):
            tables = ("NORMEC-F8", "NORMEC-T2", "NORMEC-F11")
            same = {paper_value(t, block="normec_no_sn", row=beta, column=column) for t in tables}
            assert len(same) == 1, (beta, column, same)
    # F12: the stated best cell is the maximum
    f12 = paper_numbers().query("id == 'NORMEC-F12'")
    assert f12["value"].max() == paper_value("NORMEC-F12", row="beta=0.01", column="gamma=0.1")


def test_paper_value_raises_when_not_exactly_one_row():
    with pytest.raises(KeyError, match=r"0 rows match"):
        paper_value("NORMFEDAVG-T6", dataset="fmnist", row="normfedavg")
    with pytest.raises(KeyError, match=r"0 rows match.*no id 'NORMEC-T9'"):
        paper_value("NORMEC-T9")
    with pytest.raises(KeyError, match=r"4 rows match.*dataset, row") as err:
        paper_value("NORMFEDAVG-T6")
    assert "id='NORMFEDAVG-T6'" in str(err.value)
    with pytest.raises(KeyError, match=r"72 rows match"):
        paper_value("ALIDPFL-T2", metric="test_accuracy_pct")
    # "" matches an empty cell, None does not filter
    assert paper_value("NORMFEDAVG-T3", dataset="fashion_mnist", block="", row="clip_C=0.5") == 34.25


def test_paper_numbers_returns_a_copy():
    a = paper_numbers()
    a.loc[:, "value"] = -1.0
    assert paper_value("NORMFEDAVG-T6", dataset="fashion_mnist", row="normfedavg") == 11.21


def test_paper_value_default_and_std():
    assert paper_value("NORMFEDAVG-T6", dataset="fashion_mnist", row="fedavg", field="std") == pytest.approx(0.03)
    assert paper_value("NORMEC-T2", block="normec_sn", row="beta=0.5", default=None) is None   # not printed
    with pytest.raises(KeyError, match="rows match"):                                        # ambiguous stays an error
        paper_value("NORMEC-T2", block="normec_sn", default=None)

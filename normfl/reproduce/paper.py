"""The numbers the papers print, machine-readable: ``paper_numbers.csv`` and its loader.

``paper_numbers.csv`` (next to this module, UTF-8, one value per row) holds every number printed in
the papers' tables, in the figures that are tables, and in the numeric claims the text makes about
a figure, so that a report can put "ours | paper | difference" side by side. Values are transcribed
from the paper texts (the ``source`` column cites the section, table or figure):

- NORMEC §3.4, §6 and App. I, FEDNORMEC §5 and App. D: NORMEC-EX1, NORMEC-F2, F4, F8, T2, F9, F11,
  F12 and FEDNORMEC-F1 … F4 (all CIFAR-10 + ResNet20).
- ALI Sec. VI-B: ALIDPFL-T2, T3, T4 (Tables II-IV) and the iteration counts R_c it states for each ε
  (id ``ALIDPFL-TEXT6B``, see below).
- NFA Sec. 6 and App. G: NORMFEDAVG-T2 … T6 (the bit widths t of T2/T4 are also what normfl derives,
  reading C-N7 in docs/readings.md) and the numeric claims of the captions of NORMFEDAVG-F1, F3, F4, F5.

Nothing here is computed: values normfl derives (e.g. QTDL's Δ, α, m and the Binomial's N; the R_c of
the bisection and of the exact search; the ε actually spent) are *not* paper numbers and are left out.

Omitted on purpose (no number to compare): the qualitative tables NORMEC-T1 (operator
properties), ALIDPFL-T1 (notation) and NORMFEDAVG-T1 (✓/✗ comparison of related work); NORMEC-APPC
(a recursion, no values); and the figures whose values exist only in the image (NORMEC-F1, F3,
F5, F6, F7, F10, F13; FEDNORMEC-F5; ALIDPFL-F1, F2, F3, F6; NORMFEDAVG-F2). Settings that are
inputs rather than results (ε, δ, R_s, learning rates, the "32 bits" of NFA settings (ii)/(iii))
are not included either.

Columns
-------
``id``
    The figure's or table's ID (``NORMFEDAVG-T6``, ``ALIDPFL-T2``, ``NORMEC-F12``, …). Numbers stated only in
    running text with no table/figure of their own get ``<PAPER>-TEXT<section>``: the one case is
    ``ALIDPFL-TEXT6B``, ALI Sec. VI-B's "ε = {1.55, …, 3.75} to support {79, …, 1585} iterations".
``dataset``
    ``cifar10``, ``fashion_mnist``, or empty when the number is not about one dataset.
``block``
    A sub-table or panel (``R_s=R_c`` / ``R_s=2R_c`` in ALIDPFL-T2; ``with_sn`` / ``no_sn`` for
    the panels of NORMEC-F4), the method of a best-configuration table whose rows are grouped by
    method (``normec_sn``, ``normec_no_sn``, ``dpsgd_norm``, ``clip21`` in NORMEC-F8, T2, F11), or
    the setting a claim is made in (``p=1.0``, ``beta=10.0``, ``fed_normec``). Empty otherwise
    (single-block tables such as ALIDPFL-T3/T4: their condition is in ``note``).
``row`` / ``column``
    The printed row and column labels, as short keys:

    - methods: ``ali_dpfl``, ``tau=1``; ``normfedavg``, ``fedavg``, ``dp_normfedavg``,
      ``clip_C=0.5``, ``qtdl_s=2^12``, ``bin_s=2^12`` (s as the printed power of two);
    - parameter values: ``name=value`` with the value written as Python writes the float
      (``epsilon=2.0``, ``beta=10.0``, ``gamma=0.001``, ``p=0.25``) and integers as integers
      (``tau=1``); see :func:`param_label`;
    - heatmaps: ``row`` is the first printed axis, ``column`` the second: NORMEC-F2
      ``beta=…`` × ``alpha=…``; NORMEC-F12 ``beta=…`` × ``gamma=…`` (orientation: reading
      A5 in docs/readings.md);
    - ``name=all``: aggregated over that axis (a peak over a whole heatmap, a range over a row);
      ``name=a|b``: the claim covers those values;
    - best-configuration tables (NORMEC-F8, T2, F11): ``row=beta=…``, ``column=gamma`` (the best
      γ, ``metric=best_gamma``) and ``column=final_accuracy``;
    - "which setting is best" claims: ``row=argmax``, ``column=<parameter>``,
      ``metric=best_<parameter>``;
    - comparisons: ``row`` is the method the claim favours and ``column`` is ``vs_<other method>``;
      the value is (other − row) for errors (``test_error_reduction_pct``) and (row − other) for
      accuracies (``final_test_accuracy_gain_pct``), in percentage points;
    - NFA tables: ``column=t`` (bits per coordinate) and ``column=test_error_last5``.
``metric``
    What ``value`` is: ``test_accuracy_pct`` (ALI's "Accuracy", round not stated),
    ``final_test_accuracy_pct`` (last round), ``highest_test_accuracy_pct`` (max over rounds, and
    over γ for NORMEC-F2), ``test_error_pct`` (NFA: mean of the last 5 rounds), ``bits_per_coord``,
    ``iterations``, ``best_gamma`` / ``best_alpha`` / ``best_beta``, ``transmissions_to_target``, …
    Stated ranges ("85-86%") become two rows, ``<metric>_min`` and ``<metric>_max``.
``value``
    The number as printed; percentages stay percentages (82.02, not 0.8202). The CSV keeps the
    printed digits (``51.10``, ``37.20``) so the printed precision can be read off the file; the
    loader returns float64.
``std``
    The printed ± (NFA: one std over 3 runs); empty (NaN) when none is printed.
``source``
    Where in the paper (``ALI Sec. VI-B Table II``, ``NFA App. G(iv) Table 6``, …).
``note``
    How to read it: mean over how many runs, "approximate" / "lower bound" / "upper bound" for
    text claims ("about", "more than", "at most"), and the reading (docs/readings.md) a label depends on.

Use :func:`paper_numbers` for the whole table and :func:`paper_value` for one number.
"""

from __future__ import annotations

import functools
from importlib import resources

import pandas as pd

__all__ = ["CSV_NAME", "KEY_COLUMNS", "TEXT_COLUMNS", "paper_numbers", "paper_value", "param_label"]

CSV_NAME = "paper_numbers.csv"
TEXT_COLUMNS = ("id", "dataset", "block", "row", "column", "metric", "source", "note")
KEY_COLUMNS = ("id", "dataset", "block", "row", "column", "metric")
_COLUMNS = ("id", "dataset", "block", "row", "column", "metric", "value", "std", "source", "note")
_REQUIRED = object()      # paper_value's default: a missing number is an error


def param_label(name: str, value: float | int | str) -> str:
    """The ``row``/``column`` key for a parameter value: ``param_label("epsilon", 2) == "epsilon=2.0"``.

    Floats (and ints for real-valued parameters, which should be passed as floats) are written with
    Python's ``repr`` of the float; pass an ``int`` only for integer parameters such as τ
    (``param_label("tau", 1) == "tau=1"``). Strings are used as they are (``"2^12"``).
    """
    if isinstance(value, bool):
        raise TypeError(f"param_label: {name}={value!r} is a bool, not a number")
    if isinstance(value, int):
        return f"{name}={value}"
    if isinstance(value, float):
        return f"{name}={value!r}"
    return f"{name}={value}"


@functools.lru_cache(maxsize=1)
def _load() -> pd.DataFrame:
    text_dtypes = {c: str for c in TEXT_COLUMNS}
    with resources.files(__package__).joinpath(CSV_NAME).open("r", encoding="utf-8") as f:
        df = pd.read_csv(f, dtype={**text_dtypes, "value": str, "std": str}, keep_default_na=False)
    if tuple(df.columns) != _COLUMNS:
        raise ValueError(f"{CSV_NAME}: columns {list(df.columns)}, expected {list(_COLUMNS)}")
    for c in ("value", "std"):
        df[c] = pd.Series([_to_float(x, c, i) for i, x in enumerate(df[c])], index=df.index, dtype="float64")
    return df


def _to_float(text: str, column: str, i: int) -> float:
    if text == "":
        return float("nan")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{CSV_NAME}: data row {i + 1}, column {column!r}: {text!r} is not a number") from None


def paper_numbers() -> pd.DataFrame:
    """Every paper number, one per row (columns as in the module docstring).

    Text columns hold ``""`` where empty; ``value`` and ``std`` are float64 (NaN where empty).
    Returns a fresh copy each call.
    """
    return _load().copy()


def paper_value(
    id: str,
    *,
    dataset: str | None = None,
    block: str | None = None,
    row: str | None = None,
    column: str | None = None,
    metric: str | None = None,
    field: str = "value",
    default=_REQUIRED,
) -> float:
    """The one paper number matching ``id`` and the given filters (its ``field``: ``value`` or ``std``).

    A filter left as ``None`` is not applied; ``""`` matches an empty cell. Raises ``KeyError``
    naming the filters and the number of matches unless exactly one row matches; with a
    ``default``, no match returns it (the paper prints no such number) and several still raise.
    """
    df = _load()
    filters = {"id": id, "dataset": dataset, "block": block, "row": row, "column": column, "metric": metric}
    mask = pd.Series(True, index=df.index)
    for col, want in filters.items():
        if want is not None:
            mask &= df[col] == want
    hits = df[mask]
    if len(hits) == 1:
        return float(hits[field].iloc[0])
    if len(hits) == 0 and default is not _REQUIRED:
        return default
    given = ", ".join(f"{k}={v!r}" for k, v in filters.items() if v is not None)
    if len(hits) == 0:
        same_id = df[df["id"] == id]
        if same_id.empty:
            hint = f"no id {id!r} in {CSV_NAME}; ids: {sorted(df['id'].unique())}"
        else:
            hint = "; ".join(
                f"{col} in {sorted(same_id[col].unique())}"
                for col in ("dataset", "block", "row", "column", "metric")
                if filters[col] is not None
            )
            hint = f"values present for {id!r}: {hint}"
        raise KeyError(f"paper_value({given}): 0 rows match; {hint}")
    varying = [c for c in ("dataset", "block", "row", "column", "metric") if hits[c].nunique() > 1]
    raise KeyError(
        f"paper_value({given}): {len(hits)} rows match, expected exactly 1; narrow it by {', '.join(varying)}"
    )

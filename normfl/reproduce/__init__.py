"""Reproduction helpers: the papers' printed numbers (:mod:`normfl.reproduce.paper`)."""

from normfl.reproduce.paper import KEY_COLUMNS, paper_numbers, paper_value, param_label

__all__ = ["KEY_COLUMNS", "paper_numbers", "paper_value", "param_label"]

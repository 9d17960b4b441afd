"""Algorithms, each a short composition of the parts in ``normfl.ops``; configs in ``conf/algo``."""

from normfl.algorithms.alidpfl import DPFL
from normfl.algorithms.base import Algorithm
from normfl.algorithms.dpsgd import DPSGDNorm
from normfl.algorithms.ef21 import EF21, Clip21, NormEC
from normfl.algorithms.fed import FedAvg, FedNormEC
from normfl.algorithms.nfa import NormFedAvg

__all__ = ["Algorithm", "EF21", "NormEC", "Clip21", "DPSGDNorm", "FedNormEC", "FedAvg", "NormFedAvg", "DPFL"]

"""normfl: a Hydra-configured runner for differentially private federated learning experiments."""

__version__ = "0.1.0"

"""A run's config: which keys it takes (``keys``), which values they may hold (``values``, built from the checks
in ``checks``; the privacy node's rules in ``privacy_rules``), and what names the run it describes (``run_key``).

Every bad value is refused before any data is read or any step is taken, naming the key, the value it got and
what is allowed.
"""

from normfl.config.keys import READ_BESIDE, accepted_keys, validate_keys
from normfl.config.run_key import KEY_DEFAULTS, NOT_IN_KEY, config_key
from normfl.config.values import FLAGS, GRID_PROFILES, resolve_clients, validate, validate_data
from normfl.errors import ConfigError

__all__ = ["FLAGS", "GRID_PROFILES", "KEY_DEFAULTS", "NOT_IN_KEY", "READ_BESIDE", "ConfigError", "accepted_keys",
           "config_key", "resolve_clients", "validate", "validate_data", "validate_keys"]

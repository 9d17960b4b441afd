"""The parts of ``scripts/bench.py``: the paper settings (``settings``), the instrumented round (``rounds``), the
compute floors (``floors``), the papers' style of code (``paper_style``), one setting's bench (``setting``) and
what it was measured on (``facts``), rounds as runs take them (``runs``) and sweep-level throughput (``sweep``)."""

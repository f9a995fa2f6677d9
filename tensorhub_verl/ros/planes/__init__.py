"""Data planes: how chunk bytes move between workers (the hub moves none). ``base.py`` is the seam, one plane per
file (``nixl.py``, ``tcp.py`` with its server, wire format and grants), ``registry.py`` creates them by name."""

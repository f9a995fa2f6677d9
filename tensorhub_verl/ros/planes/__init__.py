"""Data planes: how chunk bytes move between workers (the hub moves none). ``base.py`` is the seam, one plane per
file (``nixl.py``, ``tcp.py`` with its server, wire format and grants), ``config.py`` their settings, ``host.py``
what this host offers them, and ``factory.py`` creates them by name, importing a plane's module only then."""

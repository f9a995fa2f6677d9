"""The hub: its soft state as small parts behind the ``HubState`` facade (``state.py``), the planner that picks
each read's sources (``planner.py``) and the limits it admits requests under (``limits.py``). Imports nothing from
the client."""

"""The hub: its soft state as small parts behind the ``HubState`` facade (``state.py``)."""

"""What the hub and its clients share: the messages on the wire (``messages``, ``convert``), a version's manifest
and chunk map (``manifest``, ``ranges``, ``block_edges``), its digests (``lindigest``, ``lindigest_cells``,
``integrity``), and where workers are (``topology``, ``regions``). Imports nothing from the client, the hub or
the data planes."""

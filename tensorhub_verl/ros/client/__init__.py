"""The client side of ROS: ``Client`` (``client.py``) and ``connect`` (``connect.py``), which picks the client form
a hub URL asks for (one hub, ``sharded_client.py``, ``regional_client.py``), all of one contract
(``contract.WorkerClient``); the hub's HTTP API (``hub_client.py``)
and the reads of a fetch (``fetcher.py``, ``run_reads.py``). Imports nothing from the hub."""

"""TensorHub's developer tools, kept apart from the product a user installs (``tensorhub_verl``).

- ``demo``: the main job (verl's own GRPO trainer on CPU through TensorHub) and the ROS-only demo;
  ``tensorhub demo`` runs it when this package is installed.
- ``netlab``: the network lab (emulated hosts in network namespaces with shaped links; needs root).
- ``sim``: the flow-level simulator of clusters larger than one machine; it plans with the product's own planner.
- ``bench``: the research benchmarks (lab runs, soak, reader and control-plane costs); the benchmarks a user runs
  on their own cluster stay in ``tensorhub_verl.bench``.
- ``testing``: helpers for the test suite.

Install from a checkout with ``pip install -e dev/`` (``scripts/setup.sh`` does it). Nothing here ships in the
product's wheel, and the product never imports this package; these tools import the product.
"""

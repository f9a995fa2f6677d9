"""Reference-Oriented Storage (ROS): the framework-neutral core of TensorHub.

A store of model versions that keeps no copies: the hub tracks which workers hold which version
(in which layout, where in the network) and readers pull chunks straight from those holders.

Four parts, and the imports between them point one way (``tests/test_layers.py``): ``wire`` (what hub and
client share: messages, manifests, digests, topology) knows no other part; ``planes`` (the data planes) and
``hub`` (the metadata service) build on it; ``client`` builds on ``wire`` and ``planes``, never on ``hub``.
"""

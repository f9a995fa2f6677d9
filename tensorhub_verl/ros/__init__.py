"""Reference-Oriented Storage (ROS): the framework-neutral core of TensorHub.

A store of model versions that keeps no copies: the hub tracks which workers hold which version
(in which layout, where in the network) and readers pull chunks straight from those holders.
"""

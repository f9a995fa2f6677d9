"""TensorHub inside vLLM: the weight holder every rollout engine keeps, the worker extension and
weight-transfer engine that drive it, ``attach-vllm`` for a server started outside a trainer, and the
``vllm.general_plugins`` hook.

This layer sits beside ``tensorhub_verl.verl``, never above it: it imports ``tensorhub_verl.ros`` and the
shared ``tensorhub_verl.settings``, never ``tensorhub_verl.verl`` (an attached vLLM server runs without verl;
``tests/test_layers.py`` checks it). Importing the package itself has no side effects.
"""

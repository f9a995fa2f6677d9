"""Support for tests, benchmarks and the demo, in one place: tiny HF models built on the spot
(``tiny_model``), vLLM engines in their own processes driven over a pipe (``engine_proc``), and the HF <-> vLLM
layout oracle (``layout_oracle``). The library's runtime paths (hub, clients, the vLLM extension, the verl
backend) never import this package."""

"""Support for tests: the HF <-> vLLM layout oracle (``layout_oracle``) and the check for processes a test left
behind (``leftovers``). The product (``tensorhub_verl``) never imports this package."""

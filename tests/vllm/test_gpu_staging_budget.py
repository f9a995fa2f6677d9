"""Rollout staging on the GPU is checked against what vLLM's ``gpu_memory_utilization`` leaves free (``vllm.memory``):
the numbers and the fix are in the refusal."""

from __future__ import annotations

import pytest

from tensorhub_verl.errors import ConfigError
from tensorhub_verl.vllm.memory import GIB, RESERVE_BYTES, check_gpu_staging


def test_staging_that_fits_beside_vllms_share_is_accepted():
    check_gpu_staging(need_bytes=15 * GIB, free_bytes=16 * GIB + RESERVE_BYTES, total_bytes=80 * GIB, utilization=0.7)


def test_staging_that_does_not_fit_is_refused_with_the_utilization_that_fits():
    # A 7B bf16 shard (15 GiB) on an 80 GiB GPU where vLLM took 0.9 and 8 GiB are free: 8 GiB short.
    with pytest.raises(ConfigError, match=r"needs 15\.00 GiB.*only 8\.00 GiB of 80\.00 GiB.*at most 0\.80"):
        check_gpu_staging(need_bytes=15 * GIB, free_bytes=8 * GIB, total_bytes=80 * GIB, utilization=0.9)


def test_staging_larger_than_the_gpu_names_the_other_staging_modes():
    with pytest.raises(ConfigError, match="no gpu_memory_utilization leaves room.*rollout_staging='cpu'"):
        check_gpu_staging(need_bytes=70 * GIB, free_bytes=2 * GIB, total_bytes=80 * GIB, utilization=0.5)

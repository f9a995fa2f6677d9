"""``tensorhub demo``: the main job, and the ROS-only demo.

    tensorhub demo [--steps N] [--replicas N] [--json]   verl's own GRPO trainer on CPU through TensorHub (grpo.py)
    tensorhub demo --mode cross_dc --hosts N              the same across N network-lab hosts, against pulling
                                                         from the trainer (hosts.py; needs root)
    tensorhub demo ros [--readers N] [--size-mb M]       a hub, a trainer and rollout processes, no verl (ros.py)
    tensorhub demo prepare --out DIR                     only build the tiny model and data (task.py)
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if argv[:1] == ["ros"]:
        from tensorhub_dev.demo.ros import main as ros_main

        return ros_main(argv[1:])
    if argv[:1] == ["prepare"]:
        from tensorhub_dev.demo.task import main as prepare_main

        return prepare_main(argv[1:])
    from tensorhub_dev.demo.grpo import main as grpo_main

    return grpo_main(argv)

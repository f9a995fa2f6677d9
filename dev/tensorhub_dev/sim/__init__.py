"""Flow-level simulator for clusters larger than one machine.

Max-min fair link sharing (`maxmin`), an event-driven flow engine (`engine`), a cluster of NICs, rack
uplinks and a WAN (`topology`), chunked distribution strategies (`swarm`, and `tensorhub`, which runs the
real ROS planner), the hub as a modeled resource (`hub`, with costs from `bench control` in `hub_costs`),
and the paper's three rollout modes (`modes`). Entry point: `tensorhub_dev.sim.cli`.
"""

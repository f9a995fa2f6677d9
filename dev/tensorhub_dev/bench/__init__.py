"""Research benchmarks: network-lab runs of the update modes, soak, reader and control-plane costs. Each prints
its figures and one JSON object as its last line; ``tensorhub bench NAME`` runs the ones it lists."""

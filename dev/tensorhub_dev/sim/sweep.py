"""One ModeParams field varied, every other held: TensorHub's worst stall against the physical floor per value.

`python -m tensorhub_dev.sim.cli --modes standalone --sweep trainer_nodes=1,2,4,8,16,32,64` runs this;
each row says how far the worst rollout is from `ideal_s` (one copy of the version over one NIC, or over
the WAN for cross_dc) and how many copies of the version the trainer's nodes served, with the spread
between its ranks, and with a modeled hub (`--hub-measured`) the hub's figures (`modes._hub_figures`).
`--sweep run_chunks=1,64` or `--sweep hub_cores=1,8` varies the hub itself.
"""

from __future__ import annotations

import dataclasses

from tensorhub_verl.errors import ConfigError
from tensorhub_dev.sim.modes import ModeParams, run_all


def parse_sweep(spec: str) -> tuple[str, list[int | float]]:
    """`field=v1,v2,...` -> (field, values), the values typed as the ModeParams field is."""
    name, _, values = spec.partition("=")
    kinds = {f.name: f.type for f in dataclasses.fields(ModeParams)}
    if name not in kinds or not values:
        raise ConfigError(f"--sweep wants FIELD=V1,V2,... with FIELD one of {sorted(kinds)}; got {spec!r}")
    kind = float if "float" in str(kinds[name]) else int
    try:
        return name, [kind(v) for v in values.split(",") if v]
    except ValueError as e:
        raise ConfigError(f"--sweep {name}: {e}") from e


def sweep(base: ModeParams, field: str, values: list, modes: tuple[str, ...] = ("standalone",)) -> dict:
    """{"field", "values", "rows"}: one row per (value, mode) with TensorHub's figures; raises ConfigError
    for a value the cluster cannot take (e.g. more trainer nodes than chunks)."""
    rows = []
    for value in values:
        p = dataclasses.replace(base, **{field: value})
        for mode, r in run_all(p, modes=modes)["modes"].items():
            th = r["runs"]["tensorhub"]
            metric = "mean_s" if mode == "elastic" else "max_s"
            by_rank = th["trainer_bytes_by_rank"]
            rows.append({field: value, "mode": mode, "metric": metric, "tensorhub_s": round(th[metric], 3),
                         "ideal_s": round(r["ideal_s"], 3), "vs_ideal": round(th[metric] / r["ideal_s"], 3),
                         "trainer_copies": round(th["trainer_bytes_served"] / (p.weights_gb * 1e9), 3),
                         "rank_bytes_max_over_min": round(max(by_rank) / max(min(by_rank), 1.0), 2),
                         **({"hub": r["hub"]} if "hub" in r else {})})
    return {"field": field, "values": values, "rows": rows}

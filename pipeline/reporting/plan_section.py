"""The report's Plan section: the plan the launcher made (plan.json, written by
pipeline.planning.run_plan), as it was made: the layout, the memory and speed estimates and the
GPU they assumed, and why the auto values are what they are."""

from __future__ import annotations


def plan_blocks(plan: dict | None) -> list[tuple]:
    """The section's blocks; none for a run launched before plans were kept."""
    if not plan:
        return []
    gpu, hw, step = plan.get("gpu"), plan["hardware"], plan["step"]
    on_gpus = plan["layout"]["fused_kernels"]  # CPU ranks: memory only, no speed model
    fits = {True: "fits", False: "DOES NOT FIT", None: "capacity not known"}[plan.get("fits")]
    memory = f"{plan['memory_bytes']['total'] / 2**30:.1f} GiB"
    rows = [("layout", plan["description"])]
    if on_gpus and gpu:
        rows += [
            ("GPU assumed", f"{hw['name']} ({gpu['source']}), NVLink domain {hw['nvlink_domain']}"),
            ("memory per GPU (estimate)", f"{memory}, {fits}"),
            ("expected tokens/s per GPU", f"{step['tokens_per_s_per_gpu']:,.0f}"),
            ("expected MFU", f"{step['mfu']:.2f}"),
            ("expected step", f"{step['step_s']:.2f} s"),
        ]
    else:
        rows.append(("memory per CPU rank (estimate)", memory))
    if plan.get("reasons"):
        rows.append(("chosen", plan["reasons"]))
    return [("h2", "Plan"), ("table", ("", ""), rows)]

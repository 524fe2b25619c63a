"""Policies and tools over the runtime: how fast each draft setting runs here, and which to use.

runs.py      measuring settings: passes over prompts, repeats interleaved, medians, spreads, names
costs.py     the cost model's arithmetic (ARCHITECTURE §6): what a step costs, when MTP pays
probe.py     measuring the cost model with llama_decode directly
evidence.py  decayed acceptance and cost estimates, for the adaptive controller
adaptive.py  the AdaptiveController: N chosen per step (a DraftPolicy)
profiles.py  tuned profiles: the fastest setting per model and machine, saved as JSON
auto.py      `auto` and `adaptive` resolved into a config and a policy
tune.py      `mtp-cli tune`, as stage functions
bench.py     `mtp-cli bench`
"""

"""Offline work that writes the files methods read, run once per model, never on the run path:
head-identification training (`python -m offline.train_heads`: methods/heads/<model>-<recipe>.json,
with `student`, `gates`, `heads_data`), MInference's per-head pattern search (`python -m
offline.minference_search`: methods/patterns/<model>.json) and Ltri-LLM's retrieval-head scores
(`python -m offline.retrieval_heads`: results/retrieval_heads/<model>.json).

It builds on the runner (models, engine) and nothing imports it but bench/ and tests:
common <- kernels <- methods, tasks <- runners <- offline, analysis, bench.
"""

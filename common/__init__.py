"""The bottom layer every other package may import: one-line errors and the name registry.

Layers import downward only: common <- kernels <- methods, tasks <- runners <- analysis, bench."""

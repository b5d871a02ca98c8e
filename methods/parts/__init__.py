"""The methods' shared parts: what several methods use and none registers.

Stores (`stores*`: the KV layouts and their update plans, `cascade_plan`), selection rules
(`selection`, `tactic_rules`, `lychee_sets`), rotary re-rotation (`rope`), head and pattern files
(`headfile`, `minference_patterns`), key clustering (`cluster_keys`), Ltri-LLM's spans (`ltri_spans`)
and Tactic's diagnostics (`tactic_probe`). Each top-level module of methods/ is one method (its
`Method` subclass with `@register`), besides the interface (methods/base.py, methods/config.py); the
registry scans only those, so a part needs no entry anywhere.
"""

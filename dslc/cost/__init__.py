"""The cost model: pure functions of a checked plan.

:mod:`.topology` (cluster graph, groups, routes), :mod:`.collectives` (ring factors),
:mod:`.links` (bytes per link), :mod:`.schedule` and :mod:`.deadlock` (pipeline action
lists, their simulation and proof), :mod:`.memory`, :mod:`.traffic`, :mod:`.flops`,
:mod:`.time`, and :mod:`.estimate`, which gathers them for one plan.
"""

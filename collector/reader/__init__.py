"""The read side for people in terminals: ``collector jobs``, ``show``, ``logs`` and ``events``.

Only the standard library and click: a login node that runs these needs none of the
server's packages, and ``collector jobs --json`` starts without loading them.
"""

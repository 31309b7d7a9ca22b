"""The read side for people in terminals: ``collector jobs``, ``show``, ``logs``, ``events`` and ``watch``.

The readers need only the standard library and click, so a login node that runs them
needs none of the server's packages, and ``collector jobs --json`` starts without
loading them. ``collector watch`` (watch.py) adds Textual, imported by it alone.
"""

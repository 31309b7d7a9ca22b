"""The reporting side that runs inside Slurm jobs: transport, status reports, log and capture streaming.

Imports neither Flask nor SQLAlchemy (only ``requests`` and the standard library), so it
stays light inside a batch job; the server never imports it.
"""

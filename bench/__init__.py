"""Benchmarks: the collector against a raw-psycopg baseline on the same machine, same run."""

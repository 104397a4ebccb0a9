"""Fault injection for testing resilience (`fsdp-jobs chaos RUN ACTION`): inject.py acts on the rank
processes and nodes this machine can see, marathon.py deals a seeded schedule of mixed faults into a
running job. Nothing is imported here."""

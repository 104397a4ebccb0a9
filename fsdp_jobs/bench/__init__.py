"""The benchmarks: `python -m fsdp_jobs.bench NAME` (__main__.py lists them), one module a benchmark. Each prints
JSON and compares side by side in one run; nothing of the product imports this package."""

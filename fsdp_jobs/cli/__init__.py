"""The CLI and its readers: one submission path for runs and sweeps (submit.py, sweep.py), the backend
found by name (launcher.py), and the commands that read run dirs (ctl.py: status, logs, list, cancel,
goodput, compare, plot; goodput.py, stragglers.py, report.py)."""

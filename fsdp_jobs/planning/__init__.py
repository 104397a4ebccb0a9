"""Planning, the CLI's pure half: the typed config (config.py, compose.py, the backends' cluster.* schemas
found by name through backends.py), the checks of every value (inputs.py, input_rules.py) and the plan
(plan.py). Imports no torch and no backend's dependencies; the ranks read the plan and config it wrote."""

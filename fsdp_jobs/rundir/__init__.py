"""The run directory's contract: every path in it, one record type per file, atomic writes and tolerant
reads. The CLI, the backends' in-job side, the node side and the ranks meet here and nowhere else, and
nothing outside this package spells a run-dir file's name. Imports no torch."""

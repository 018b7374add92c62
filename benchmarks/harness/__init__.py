"""What every benchmark shares: running a worker in its own watched process (:mod:`.process`), the peak memory of
each process (:mod:`.memory`), and cached run records with the machine, versions and commit (:mod:`.records`)."""

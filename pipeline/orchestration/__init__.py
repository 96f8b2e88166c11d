"""Running the steps: which steps a run needs in what order (graph), the callables a job runs
(tasks), the executors that run them (in this process, local subprocesses, Slurm, or a dry run
that prints what it would submit), the Slurm queue, the launch, status and sweeps."""

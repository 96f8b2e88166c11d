"""Fault tolerance of a training job, as one feature: each rank reports its progress
(progress) and its death (guard); a watchdog per node finds a rank that stopped (watchdog);
the job's supervisor tells what ended an attempt (faults), decides what to do about it
(decisions), records it in train/failures.jsonl (records) and restarts the ranks on the
nodes left or requeues the job; every call to Slurm's commands goes through one adapter
(scheduler). docs/reliability.md describes it for users."""

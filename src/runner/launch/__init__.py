"""Running jobs: the command line's checks (preflight), a sweep and its parent run (sweep), the
interleaved rounds (rounds), worker processes (isolation, fork_server), and cluster launchers (slurm,
ray_launch, cluster_jobs)."""

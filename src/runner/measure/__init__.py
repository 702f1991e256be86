"""One job, measured: its inputs (data), the call timed (tasks), the timing itself (timing), what
the machine and memory allow (limits, machine_load, energy), and the job from set-up to record (job)."""

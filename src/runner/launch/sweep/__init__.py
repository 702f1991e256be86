"""A sweep's lifecycle, in the launching process, whatever launcher runs its jobs.

`callback.py`: Hydra's callback opens the sweep before the launch and closes it after; the app runs Hydra inside
`closed_when_stopped`, which closes it where Hydra skips that (a stopped or refused launch).
`lifecycle.py`: sweep.json and the MLflow parent run, opened and closed once, with the sweep's status.
`summary.py`: the closing output: the table on the terminal, the answer, summary.md and the report.
`notes.py`: each job's MLflow run annotated with how it compares.
`sync.py`: `runner sync` of a sweep kept locally.
"""

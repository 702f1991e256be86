"""The MLflow tags the history writes, each named once (the control's case, which it reads, is runner.record.runs'
CONTROL_TAG, where a run records it)."""

CHANGE_TAG = "history.change"  # a curator's mark: the distribution changes at this run (why, as its value)
CONFIRMED_TAG = "history.confirmed"  # on a flagged run, runner.history.confirm's word: 'yes: ...' or 'no: ...'
CONFIRMS_TAG = "history.confirms"  # on a confirming re-run: the run whose step it was made to check
VERDICT_TAG = "history.verdict"  # on a case's newest run, with --record: its history's word (describe.verdict)

"""The MLflow tags the history reads and writes, each named once."""

CHANGE_TAG = "history.change"  # a curator's mark: the distribution changes at this run (why, as its value)
CONTROL_TAG = "control_case"  # the case of the control its sweep timed beside it (runner.launch.control)
CONFIRMED_TAG = "history.confirmed"  # on a flagged run, runner.history.confirm's word: 'yes: ...' or 'no: ...'
CONFIRMS_TAG = "history.confirms"  # on a confirming re-run: the run whose step it was made to check
VERDICT_TAG = "history.verdict"  # on a case's newest run, with --record: its history's word (describe.verdict)

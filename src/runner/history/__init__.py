"""`runner history`: each case's runs over time on one kind of machine, the steps found in them, and the gate a CI job
runs on them.

series.py holds a case's series (Entry, History); steps.py and partition.py find its steps; fdr.py holds a store's steps
to a false-discovery rate; numbers.py and figures.py fit the other series a run records; build.py makes the histories
and describe.py says them; gaps.py finds the cases that failed or went missing; gate.py decides --fail-on, confirm.py
runs a flagged case again; store.py reads a store (and writes only where asked), with the tags of tags.py; as_json.py,
markdown.py and page.py write what was found for tools, a pull request and a person."""

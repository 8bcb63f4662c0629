"""The analysis as a report: a frozen tree of figures with its recommendation, rendered as JSON,
text, HTML with plots, or alerting rules.

document.py        `build_report(analysis)`: the `Report` (its figures: ../report_tree.py;
                   `Report.to_dict()` is the JSON document `--format json` prints)
replay_numbers.py  the replay's numbers per strategy, as tree nodes
notes.py           the caveats a reader needs to weigh the figures
text.py            the terminal summary
html_page.py       one self-contained HTML page
plots.py           the PNG plots the page embeds
alerts.py          `--format alerts`: the recommendation's alarms as Prometheus rules
compare.py         `--compare OLD NEW`: two JSON documents, which recommendation changed and why
"""

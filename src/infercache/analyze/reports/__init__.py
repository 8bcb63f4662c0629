"""The analysis as a report: one JSON-able document, rendered as text, HTML with plots.

document.py        `build_report(analysis, recommendation)`: the document (its schema)
replay_numbers.py  the replay's numbers per strategy, in the document's shape
text.py            the terminal summary
html_page.py       one self-contained HTML page
plots.py           the PNG plots the page embeds
"""

"""`infercache tune`: the offline side of the semantic layer (nothing here runs on a request).

- inputs: `pairs` (a, b, same), `intents` (text, label);
- measuring and choosing a threshold: `calibrate` (pairs), `cache_sim` (simulated lookups on
  labelled texts);
- `fit` (`tune --fit`: an adapter and a head fitted to labelled texts);
- `tune` (what the command does with its files) and `cli` (its arguments and report).
The serving layer (`semantic/`) never imports this package; this package reads the serving
layer's rules (`decision.accept`, `matcher`, `guards`) so that what is measured is what runs.
"""

"""Adapters that put infercache under other frameworks. Each module imports its framework, so
each is installed with its own extra (`infercache[langchain]`); importing this package imports
none of them."""

"""trainwarden's benchmarks: the daemon side by side with what people use instead.

`python -m bench [--quick] [--out DIR]` runs every comparison on this machine in one go
and writes DIR/RESULTS.md (tables, PNG plots) and DIR/results.json. See bench/__main__.py.
"""

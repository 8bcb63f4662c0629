"""Embeddings cached per input string, so a batch with k new inputs out of n sends only those k.

embedding_request.py  the pure steps: parse and key each input, split the upstream's answer
                      and its usage among them, merge hits and fetched vectors in order
embedding_cache.py    the store I/O around them: look each input up, store what was fetched
embedding_miss.py     the missing inputs as a lease of the one miss protocol
                      (miss_flight.py): identical batches in flight make one call
"""

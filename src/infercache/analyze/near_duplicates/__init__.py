"""The analyzer's near-duplicate census: which requests a semantic cache could answer from an
earlier request of their scope.

    finder.py           is there an earlier text in the scope the live semantic layer would
                        accept? (the layer's own accept rule, on a uniform sample of a large log)
    scoped_texts.py     distinct texts per scope with a vector index each
    word_index.py       candidate texts by shared words (the cheap half of the candidate stage)
    ngram_embedder.py   a model-free embedder for the other half
    default_matcher.py  the matcher used without a calibration (default_matcher.json)
    embedders.py        the embedders `analyze` measures with, each loaded on first use
"""

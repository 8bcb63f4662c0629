"""Prompt → token ids as a server tokenises them, fast enough for a day of traffic.

Shared by the traffic analyzer (analyze/: census, prefix breakers, KV sweep) and the serving
gateway's redacted request log (redaction.py: chained prefix hashes), so it stands below both.

tokenizers.py   `PromptTokenizer` and its implementations (the packaged SmolLM2, chars4,
                any tokenizer.json folder); `load_tokenizer(spec)`
chat_frames.py  a chat template as the literal frame around the message contents
cached_runs.py  text → ids through caches of the runs between special tokens
"""

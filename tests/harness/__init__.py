"""What many tests share, written once (import it; fixtures stay in the conftest.py files).

servers.py     `serve(app)`: any ASGI app on a loopback port under uvicorn in a thread, yielded
               once started; `free_port()`
engine_gateway.py  `serve_engine_gateway`: the gateway with the built-in engine, on loopback
processes.py   real `infercache` processes waited on through their own output: `start`/`stop`,
               `engine_server` (`infercache engine serve` on a free port), `sqlite_lock_held`
upstreams.py   stand-ins for a paid provider: `FakeUpstream` (HTTP, for the gateway) and
               `CountingUpstream` (the library's upstream function)
cli.py         `run_analyze(...)`: `infercache analyze` in-process
vocabulary.py  `chat(...)`: the deterministic request body tests speak in
openai_streams.py  `streamed(client, ...)`: an SDK chat stream with usage, read to the end
embedders.py   `Remembered`: MiniLM's vectors of a day's texts, embedded in one batch up front
flight_watch.py  `FlightWatch`: a flight table's observer, to wait on its flights, waiters and
               readers instead of sleeping
"""

"""Moved to tests/harness/ (issue 24): `serve` to tests.harness.servers, `FakeUpstream` to
tests.harness.upstreams. These names stay here only until branches written against the old path
are merged; import from tests.harness in new code."""

from tests.harness.servers import serve
from tests.harness.upstreams import FakeUpstream

__all__ = ["FakeUpstream", "serve"]

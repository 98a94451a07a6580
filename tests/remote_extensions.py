"""A RemoteTriton in a process of its own, for the tests of what it adds to a server: custom metrics and routes.

    python -m tests.remote_extensions URL [NAME]

It defines `test_remote_outside`, a counter made outside any callable and incremented once before binding;
binds NAME (default `remote_counting`: tests.test_custom_metrics.Counting, families `test_remote_*`);
prints "BOUND"; then answers one command per line of its standard input, and exits at its end:
    bump     increments test_remote_outside (outside a callable); prints DONE
    close    closes the RemoteTriton; prints CLOSED
"""

from __future__ import annotations

import sys

from pytriton.metrics import MetricFamily
from pytriton.model_config import ModelConfig
from pytriton.remote_triton import RemoteTriton
from tests.test_custom_metrics import INPUTS, OUTPUTS, Counting


def main() -> None:
    outside = MetricFamily("test_remote_outside", "Counted outside any callable", MetricFamily.COUNTER).Metric()
    outside.increment()
    remote = RemoteTriton(url=sys.argv[1])
    remote.connect()
    remote.bind(
        sys.argv[2] if len(sys.argv) > 2 else "remote_counting",
        Counting("test_remote"),
        inputs=INPUTS,
        outputs=OUTPUTS,
        config=ModelConfig(max_batch_size=4),
    )
    print("BOUND", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "bump":
            outside.increment()
            print("DONE", flush=True)
        elif command == "close":
            remote.stop()
            print("CLOSED", flush=True)
    remote.stop()


if __name__ == "__main__":
    main()

"""The OpenAI streaming bench (bench/openai_stream.py) end to end, on /v1 and its stand-in route (no LitServe needed).

LitServe is left out on purpose: it is not a test dependency (it needs Python >= 3.10 and brings its own web
stack); what this checks is the bench's own machinery: the server script, readiness, verification, the SSE load
generator's token and time-to-first-token accounting, the CPU reading, the table and the JSON.
"""

from __future__ import annotations

import json

from bench import openai_stream


def test_run_counts_every_token_of_every_stream(tmp_path, capsys):
    argv = ["--quick", "--targets", "ours,ours-gs", "--concurrency", "1,4", "--duration", "0.5"]
    status = openai_stream.main([*argv, "--results-dir", str(tmp_path)])

    assert status == 0
    (results_file,) = tmp_path.glob("openai-*.json")
    summary = json.loads(results_file.read_text())
    assert summary["failures"] == {}
    for target in ("ours", "ours-gs"):
        for concurrency in ("1", "4"):
            _check_point(summary["results"][target][concurrency], concurrency)
    table = capsys.readouterr().out
    assert "| 4 " in table and "tokens/s" in table and "server CPU us/token" in table


def _check_point(points: list, concurrency: str) -> None:
    """One target's figures at one concurrency: every token of every stream counted, no error."""
    (point,) = points
    assert point["errors"] == 0
    assert point["requests"] >= int(concurrency)
    assert point["tokens"] == openai_stream.TOKENS * point["requests"]
    assert 0 < point["ttft_p50_ms"] <= point["ttft_p99_ms"]
    assert point["server_cpu_s"] > 0 and point["client_cpu_s"] > 0

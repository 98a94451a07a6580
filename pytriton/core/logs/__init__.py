"""The server's own log lines that stay bounded: failing models' causes, lines per interval, deep tracebacks."""

"""Constants shared by the public API and the engine, and those nvidia-pytriton 0.7 defines at this path."""

import os
import pathlib

DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
DEFAULT_ADDRESS = "0.0.0.0"
DEFAULT_EXIT_TIMEOUT_S = 30
DEFAULT_SERVER_NAME = "triton"
TRITON_CONTEXT_FIELD_NAME = "triton_context"
TRITON_LOCAL_IP = "127.0.0.1"
# 0.7's wait for tritonserver to start (RemoteTriton.connect() waits as long for a starting server).
DEFAULT_TRITON_STARTUP_TIMEOUT_S = 120
# 0.7's timeout for creating its own tritonclient clients; unused here.
CREATE_TRITON_CLIENT_TIMEOUT_S = 10
# 0.7 keeps tritonserver's Python backend interpreters in a directory of this name; nothing uses it here.
TRITON_PYTHON_BACKEND_INTERPRETER_DIRNAME = "python_backend_interpreter"
# 0.7's cache directory ($PYTRITON_HOME, else $XDG_CACHE_HOME/pytriton, else ~/.cache/pytriton), computed the
# same way at import; this package writes nothing there.
PYTRITON_HOME = pathlib.Path(
    os.path.expanduser(
        os.path.expandvars(
            os.getenv("PYTRITON_HOME", os.path.join(os.getenv("XDG_CACHE_HOME", "$HOME/.cache"), "pytriton"))
        )
    )
).resolve()

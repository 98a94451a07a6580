"""Code written for nvidia-pytriton 0.7 finds every name it uses here, with the same signature.

`tests/data/nvidia_pytriton_0.7.0_api.json` is nvidia-pytriton 0.7.0's user API as `tests/api_dump.py` sees it
(public names, class members, signatures with defaults, coroutine or not). Members only built-in types define
(BaseException's with_traceback, add_note) are Python's, different in each Python version, and left out. The
first test compares this package with it, name by name, on whichever supported Python runs the tests; the
second regenerates it from nvidia-pytriton itself, so the file cannot drift from the release. A deliberate
difference is listed in ALLOWED with its reason (and in docs/migration.md).
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import subprocess
from typing import Any, Dict, List

from tests import api_dump

DUMP = pathlib.Path(__file__).parent / "data" / "nvidia_pytriton_0.7.0_api.json"
PEER_PYTHON = os.environ.get("PYTRITON_NVIDIA_PYTHON", "/tmp/nvidia-pytriton/bin/python")
INSTALL_HINT = (
    "nvidia-pytriton 0.7.0 is not installed at {python}: install it with "
    "`../shared/peer/setup-nvidia-pytriton.sh /tmp/nvidia-pytriton` (or `python3 -m venv DIR && "
    "DIR/bin/pip install nvidia-pytriton==0.7.0`) and point PYTRITON_NVIDIA_PYTHON at DIR/bin/python"
)
_TRITONSERVER = "there is no tritonserver process or Python backend here (docs/migration.md)"
_SEEDS_PERIOD = "serve() also takes the seeds' `monitoring_period_sec` (PyTriton 0.5's name), keyword-only"
_SEQUENCES = "one more field, last and defaulted, for sequence batching (stateful models; 0.7 has none)"
_OPENAI_BIND = "one more keyword-only argument, `openai`: the model answers the OpenAI API too (docs/openai.md)"
_OPENAI_KEY = "one more field, `openai_api_key`: the Bearer key of the OpenAI API (docs/openai.md)"
_CLIENT_TOKEN = "every client takes `access_token` (0.7: ModelClient only), for servers that restrict inference too"

# "module:Name" or "module:Name.member" -> why it differs from nvidia-pytriton 0.7.0.
ALLOWED: Dict[str, str] = {
    "pytriton.triton:TRITONSERVER_DIST_DIR": _TRITONSERVER,
    "pytriton.triton:INITIAL_BACKEND_SHM_SIZE": _TRITONSERVER,
    "pytriton.triton:GROWTH_BACKEND_SHM_SIZE": _TRITONSERVER,
    "pytriton.triton:WAIT_FORM_MODEL_TIMEOUT_S": "models are ready when bound: run() waits for nothing but warm-ups",
    "pytriton.triton:Triton.__init__": "more keyword-only arguments: `limits` (request size, timeout and "
    "connection limits of this server), `frontends`, `openai_port` (the OpenAI API's own port); 0.7's `workspace` "
    "may not be a pytriton.utils.workspace.Workspace",
    "pytriton.triton:Triton.serve": _SEEDS_PERIOD,
    "pytriton.triton:TritonBase.serve": _SEEDS_PERIOD,
    "pytriton.triton:RemoteTriton.serve": _SEEDS_PERIOD,
    **{f"pytriton.triton:{server}.bind": _OPENAI_BIND for server in ("Triton", "TritonBase", "RemoteTriton")},
    "pytriton.triton:TritonSecurityConfig": _OPENAI_KEY,
    "pytriton.triton:TritonSecurityConfig.__init__": _OPENAI_KEY,
    "pytriton.triton:TritonConfig.__init__": "0.7 wraps the dataclass in a function taking (*args, **kwargs) that "
    "refuses positional arguments; here __init__ names its fields, keyword-only, with the same effect",
    **{
        f"{module}:{client}.__init__": _CLIENT_TOKEN
        for module in ("pytriton.client", "pytriton.client.client")  # the second is where 0.7 defines them
        for client in (
            "AsyncioModelClient",
            "AsyncioDecoupledModelClient",
            "DecoupledModelClient",
            "FuturesModelClient",
        )
    },
    **{
        f"{module}:Tensor": "three more fields after 0.7's (format, labels, label_filename: Triton's input format "
        "and classification labels); 0.7's fields and arguments are unchanged"
        for module in ("pytriton.model_config", "pytriton.model_config.tensor")
    },
    "pytriton.model_config:ModelConfig": _SEQUENCES,
    "pytriton.model_config.model_config:ModelConfig": _SEQUENCES,
    "pytriton.model_config.triton_model_config:TritonModelConfig": _SEQUENCES,
    "pytriton.proxy.types:Request": "more fields, last and defaulted, for sequence batching: sequence_id, "
    "sequence_start, sequence_end, sequence_state, sequence_serial",
    "pytriton.proxy.types:Request.__getitem__": "Request and Response share one mapping base (PyTriton repeats it); "
    "the key parameter is `name`, never passed by keyword",
    "pytriton.proxy.types:Request.__setitem__": "the shared mapping base names its parameters `name` and `value`",
    "pytriton.proxy.types:Request.__delitem__": "the shared mapping base names its parameter `name`",
    "pytriton.proxy.types:Response.__getitem__": "the shared mapping base names its parameter `name`",
    "pytriton.proxy.types:Response.__setitem__": "the shared mapping base names its parameters `name` and `value`",
    "pytriton.proxy.types:Response.__delitem__": "the shared mapping base names its parameter `name`",
}


def _public_names(dump: Dict[str, Any]) -> set:  # type: ignore[type-arg]
    """Every public name of every module in a dump (bases are compared by these names only)."""
    return {name for module in dump.values() for name in module}


def _class_gaps(where: str, theirs: Dict[str, Any], ours: Dict[str, Any], public: set) -> List[str]:  # type: ignore[type-arg]
    """How a class of ours differs from theirs: missing or different members, fields, public bases."""
    gaps: List[str] = []
    if ours.get("kind") != theirs["kind"]:
        return [f"{where}: a {ours.get('kind')} here, a {theirs['kind']} in 0.7"]
    missing_bases = [base for base in theirs["bases"] if base in public and base not in ours["bases"]]
    if missing_bases:
        gaps.append(f"{where}: does not derive from {missing_bases}")
    if "fields" in theirs and ours.get("fields") != theirs["fields"]:
        gaps.append(f"{where}: fields {ours.get('fields')}, 0.7 has {theirs['fields']}")
    for member, described in theirs["members"].items():
        key = f"{where}.{member}"
        if key in ALLOWED:
            continue
        mine = ours["members"].get(member)
        if mine is None:
            gaps.append(f"{key}: missing")
        elif mine != described:
            gaps.append(f"{key}: {mine}\n    0.7: {described}")
    return gaps


def test_every_name_of_nvidia_pytriton_0_7_is_here_with_its_signature() -> None:
    theirs = json.loads(DUMP.read_text())
    public = _public_names(theirs)
    gaps: List[str] = []
    for module_name, names in theirs.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            gaps.append(f"{module_name}: {error}")
            continue
        for name, described in names.items():
            where = f"{module_name}:{name}"
            if where in ALLOWED:
                continue
            if not hasattr(module, name):
                gaps.append(f"{where}: missing")
                continue
            mine = api_dump.describe(getattr(module, name))
            if described["kind"] in ("class", "enum"):
                gaps += _class_gaps(where, described, mine, public)
            elif mine != described:
                gaps.append(f"{where}: {mine}\n    0.7: {described}")
    assert not gaps, "differences from nvidia-pytriton 0.7.0 (fix them, or explain them in ALLOWED):\n" + "\n".join(
        gaps
    )


def test_every_allowed_difference_is_a_real_one() -> None:
    """An entry of ALLOWED that no longer differs is removed, so the list stays the list of differences."""
    theirs = json.loads(DUMP.read_text())
    stale = []
    for key in ALLOWED:
        module_name, _, path = key.partition(":")
        name, _, member = path.partition(".")
        described = theirs[module_name][name]
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            continue
        mine = api_dump.describe(getattr(module, name))
        if member:
            if mine.get("members", {}).get(member) == described["members"][member]:
                stale.append(key)
        elif mine == described:
            stale.append(key)
    assert not stale, f"these no longer differ from 0.7; remove them from ALLOWED: {stale}"


def test_the_recorded_api_is_nvidia_pytriton_0_7s() -> None:
    """Regenerate the dump with nvidia-pytriton 0.7.0 itself (in its own venv) and compare."""
    assert os.path.exists(PEER_PYTHON), INSTALL_HINT.format(python=PEER_PYTHON)
    version = subprocess.run(
        [PEER_PYTHON, "-I", "-c", "import importlib.metadata as m; print(m.version('nvidia-pytriton'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == "0.7.0", f"{PEER_PYTHON} has nvidia-pytriton {version}, not 0.7.0"
    dumped = subprocess.run(
        [PEER_PYTHON, "-I", str(pathlib.Path(api_dump.__file__))],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",  # never this checkout: its `pytriton` would shadow NVIDIA's
    ).stdout
    assert json.loads(dumped) == json.loads(DUMP.read_text())

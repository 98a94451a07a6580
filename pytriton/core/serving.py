"""What the HTTP and gRPC frontends ask of the engine, as protocols.

Two things answer them: the engine itself, and its stand-in in a frontend process (runtime/frontends/remote.py),
which sends requests to the process that holds the models.
"""

from __future__ import annotations

from typing import AsyncIterator, List, Optional, Protocol, Sequence

from pytriton.core.engine import SpecChange
from pytriton.core.model import RepositoryEntry, ServedModel
from pytriton.core.request import InferenceRequest, InferenceResponse
from pytriton.core.shared_memory.cuda import CudaSharedMemory
from pytriton.core.shared_memory.system import SystemSharedMemory
from pytriton.core.spec import ModelSpec
from pytriton.core.watch import Disconnect


class ServingModel(Protocol):
    """One model version as a frontend sees it: its spec, and requests run on it."""

    spec: ModelSpec

    @property
    def out_of_date(self) -> bool:
        """Whether it was unloaded or replaced since it was found: a request found with it looks it up again."""

    async def infer(self, request: InferenceRequest, gone: Optional[Disconnect] = None) -> InferenceResponse:
        """Run one request; its single response. `gone()` returns once its client has disconnected."""

    def stream(self, request: InferenceRequest) -> AsyncIterator[InferenceResponse]:
        """Run one request; its responses (a decoupled model may give 0..n)."""

    def record_tokens(
        self, first_token_ns: int, gaps_ns: Sequence[int], output_tokens: int, prompt_tokens: int
    ) -> None:
        """Count one generation's tokens in the model's statistics (core/stats.TokenStats), where they are kept."""


class ServingEngine(Protocol):
    """The models and the server's state, as the frontends read and change them."""

    server_name: str
    system_memory: SystemSharedMemory
    cuda_memory: CudaSharedMemory

    @property
    def live(self) -> bool:
        """Server liveness."""

    @property
    def ready(self) -> bool:
        """Server readiness."""

    @property
    def has_cache(self) -> bool:
        """Whether a response cache is configured."""

    def model(self, name: str, version: str = "") -> ServingModel:
        """The model version a request names (latest when the version is empty), or NOT_FOUND."""

    def models(self) -> List[ServedModel]:
        """Every model version, by name then version."""

    def model_ready(self, name: str, version: str = "") -> bool:
        """Whether a model version exists and takes requests."""

    def statistics_of(self, name: str = "", version: str = "") -> List[ServedModel]:
        """The model versions a statistics request names."""

    def repository(self) -> List[RepositoryEntry]:
        """The repository index."""

    async def load(self, name: str, change: Optional[SpecChange] = None) -> None:
        """Serve a model again, as bound or with a config override."""

    async def unload(self, name: str) -> None:
        """Stop serving a model."""

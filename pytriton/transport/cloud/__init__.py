"""Cloud frontends: SageMaker and Vertex AI routes served by the KServe v2 HTTP app on their own ports."""

from pytriton.transport.cloud.sagemaker import SageMakerFrontend
from pytriton.transport.cloud.vertex import VertexAiFrontend

__all__ = ["SageMakerFrontend", "VertexAiFrontend"]

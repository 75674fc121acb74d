"""The neural-net engine: layers, loss, initialisers, flat storage, model registry."""

from ssdmpi.nn.flat import FlatParams, ParamSpec
from ssdmpi.nn.model import Model
from ssdmpi.nn.models import MODELS, build_model

__all__ = ["FlatParams", "ParamSpec", "Model", "MODELS", "build_model"]

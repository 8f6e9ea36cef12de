"""Tokenizer: a `tokenizers` tokenizer plus the chat template and special ids, built from an HF
directory or from GGUF metadata (never fetched from a hub)."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from radixserve.grammar.vocab import VocabInfo, detect_vocab_type

# Turn-ending tokens: chat models stop on these even where the file's eos id names another token.
TURN_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "</s>")
# The tool-call formats' markup (api/openai/tool_formats.py). Where a tokenizer has one of these as a
# special token (Mistral's [TOOL_CALLS], harmony's channels), it is the model's own way to write it:
# grammars match it as its text, so that an `auto` call can begin with it. Stop tokens among them
# stay stop tokens.
TOOL_MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "<|start|>", "<|channel|>",
                      "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>")

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp pre-tokenizer name -> (split regex, digits split one by one first)
_GGUF_PRE = {
    "default": (_GPT2_SPLIT, False), "gpt-2": (_GPT2_SPLIT, False), "smollm": (_GPT2_SPLIT, True),
    "llama-bpe": (_LLAMA3_SPLIT, False), "llama3": (_LLAMA3_SPLIT, False), "qwen2": (_QWEN2_SPLIT, False),
}


class TokenizerError(ValueError):
    pass


class Tokenizer:
    def __init__(self, tok: HFTokenizer, chat_template: Optional[str], bos_token_id: Optional[int],
                 eos_token_id: Optional[int], add_bos: bool):
        self.tok = tok
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos and bos_token_id is not None
        vocab = tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        self.special_ids = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        eos = {eos_token_id} if eos_token_id is not None else set()
        eos |= {vocab[t] for t in TURN_END_TOKENS if t in vocab and vocab[t] in self.special_ids}
        self.eos_token_ids = sorted(eos)
        self._template = None

    def token_text(self, token_id: int) -> Optional[str]:
        return self.tok.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        if not self.chat_template:
            raise TokenizerError("this model has no chat template")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(v, indent=indent, ensure_ascii=False)
            env.globals["raise_exception"] = _raise_template_error
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)
        bos = self.tok.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=bos, eos_token="", **extra)
        except jinja2.TemplateError as e:
            raise TokenizerError(f"chat template failed: {e}") from None

    def vocab_info(self, model_vocab_size: Optional[int] = None, extra_stop_ids: tuple[int, ...] = ()) -> VocabInfo:
        """What grammar backends need from this tokenizer. `model_vocab_size` is the logits width
        (defaults to the tokenizer's size); `extra_stop_ids` adds stop ids (e.g. the config's eos)."""
        tokens = [self.tok.id_to_token(i) for i in range(self.vocab_size)]
        added = self.tok.get_added_tokens_decoder()
        stops = set(self.eos_token_ids) | set(extra_stop_ids)
        markup = {i for i in self.markup_ids() if i not in stops}
        return VocabInfo(
            tokens=tuple(tokens),
            vocab_type=detect_vocab_type(tokens, repr(self.tok.decoder)),
            stop_token_ids=tuple(sorted(stops)),
            model_vocab_size=model_vocab_size or self.vocab_size,
            special_token_ids=frozenset(self.special_ids - markup),
            literal_token_ids=frozenset({i for i, t in added.items() if not t.special} | markup),
        )

    def markup_ids(self) -> dict[int, str]:
        """This tokenizer's special tokens that are tool-call markup: id -> text."""
        ids = {self.tok.token_to_id(t): t for t in TOOL_MARKUP_TOKENS}
        return {i: t for i, t in ids.items() if i is not None and i in self.special_ids}

    def save(self, directory: str | Path) -> None:
        """Write tokenizer.json and tokenizer_config.json (used to build test model directories)."""
        directory = Path(directory)
        tok = HFTokenizer.from_str(self.tok.to_str())
        if self.add_bos:
            bos = self.token_text(self.bos_token_id)
            tok.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, self.bos_token_id)])
        tok.save(str(directory / "tokenizer.json"))
        cfg = {"chat_template": self.chat_template, "add_bos_token": self.add_bos,
               "bos_token": self.token_text(self.bos_token_id) if self.bos_token_id is not None else None,
               "eos_token": self.token_text(self.eos_token_ids[0]) if self.eos_token_ids else None}
        (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))

    # ---- construction ----------------------------------------------------
    @classmethod
    def from_hf_dir(cls, path: Path) -> "Tokenizer":
        tj = path / "tokenizer.json"
        if not tj.exists():
            raise TokenizerError(f"{path} has no tokenizer.json")
        tok = HFTokenizer.from_file(str(tj))
        cfg = _read_json(path / "tokenizer_config.json")
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text()
        vocab = tok.get_vocab(with_added_tokens=True)

        def token_id(key: str) -> Optional[int]:
            t = cfg.get(key)
            t = t.get("content") if isinstance(t, dict) else t
            return vocab.get(t) if t else None

        # tokenizer.json's post-processor says whether the model wants a BOS
        with_special = tok.encode("a").ids
        plain = tok.encode("a", add_special_tokens=False).ids
        adds_bos = len(with_special) > len(plain) and with_special[0] != plain[0]
        bos = with_special[0] if adds_bos else token_id("bos_token")
        return cls(tok, template, bos, token_id("eos_token"), add_bos=adds_bos)

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any]) -> "Tokenizer":
        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise TokenizerError(
                f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' is); "
                "use the model's Hugging Face directory instead")
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        pre = fields.get("tokenizer.ggml.pre", "default")
        split, digits = _GGUF_PRE.get(pre, _GGUF_PRE["default"])
        steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
        steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
        tok.decoder = decoders.ByteLevel()
        # control (3) and user-defined (4) tokens are matched whole, before BPE
        tok.add_tokens([AddedToken(t, special=(ty == 3), normalized=False)
                        for t, ty in zip(tokens, types) if ty in (3, 4)])
        return cls(tok, fields.get("tokenizer.chat_template"), fields.get("tokenizer.ggml.bos_token_id"),
                   fields.get("tokenizer.ggml.eos_token_id"),
                   add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)))


def _raise_template_error(msg: str):
    raise jinja2.TemplateError(msg)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}

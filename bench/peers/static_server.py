"""Static batching baseline: `transformers` `generate()` behind a minimal OpenAI-compatible shim.

This is the approach continuous batching replaces: a request waits until its batch fills
(--max-batch-size) or the first request in it has waited --batch-timeout seconds; the batch is
left-padded to its longest prompt and runs until its longest member ends. Tokens are streamed as
`generate()` produces them, so TTFT is measured fairly. Greedy decoding only; `response_format`
is ignored (plain `generate()` has no grammar), which the json-schema workload's validity shows.

    .venv/bin/python bench/peers/static_server.py --port 8100
"""
from __future__ import annotations

import argparse
import asyncio
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.generation.streamers import BaseStreamer


@dataclass
class Pending:
    """One request waiting for, then riding in, a static batch."""
    prompt_ids: list[int]
    max_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    tokens: list[int] = field(default_factory=list)
    sent_text: str = ""
    done: bool = False

    def emit(self, event: dict) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class RowStreamer(BaseStreamer):
    """Splits each step's [batch] tokens into per-request text deltas; rows stop at EOS or max_tokens."""

    def __init__(self, rows: list[Pending], tokenizer, eos_ids: set[int]):
        self.rows, self.tok, self.eos = rows, tokenizer, eos_ids
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate() first hands over the prompt ids
            self.prompt_seen = True
            return
        for row, token in zip(self.rows, value.view(-1).tolist()):
            if row.done:
                continue
            if token in self.eos:
                self._finish(row, "stop")
                continue
            row.tokens.append(token)
            text = self.tok.decode(row.tokens, skip_special_tokens=True)
            if not text.endswith("\ufffd"):  # hold back a partial UTF-8 sequence
                row.emit({"delta": text[len(row.sent_text):]})
                row.sent_text = text
            if len(row.tokens) >= row.max_tokens:
                self._finish(row, "length")

    def end(self) -> None:
        for row in self.rows:
            if not row.done:
                self._finish(row, "length")

    def _finish(self, row: Pending, reason: str) -> None:
        row.done = True
        row.emit({"finish": reason, "prompt_tokens": len(row.prompt_ids), "completion_tokens": len(row.tokens)})


class StaticBatcher:
    """Collects requests into fixed batches and runs each through `generate()` on one thread."""

    def __init__(self, model, tokenizer, max_batch_size: int, batch_timeout: float):
        self.model, self.tok = model, tokenizer
        self.max_batch_size, self.batch_timeout = max_batch_size, batch_timeout
        self.inbox: queue.Queue[Pending] = queue.Queue()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = {tokenizer.eos_token_id}
        threading.Thread(target=self._loop, name="static-batcher", daemon=True).start()

    def _loop(self) -> None:
        while True:
            batch = [self.inbox.get()]
            deadline = time.monotonic() + self.batch_timeout
            while len(batch) < self.max_batch_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    batch.append(self.inbox.get(timeout=left))
                except queue.Empty:
                    break
            try:
                self._run(batch)
            except Exception as e:  # a failed batch fails its requests, never the server
                for row in batch:
                    if not row.done:
                        row.done = True
                        row.emit({"error": f"{type(e).__name__}: {e}"})

    @torch.inference_mode()
    def _run(self, batch: list[Pending]) -> None:
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.tensor([[self.pad_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch])
        mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch])
        streamer = RowStreamer(batch, self.tok, self.eos_ids)
        self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                            max_new_tokens=max(r.max_tokens for r in batch),
                            pad_token_id=self.pad_id, eos_token_id=list(self.eos_ids), streamer=streamer)


def build_app(batcher: StaticBatcher, model_name: str) -> FastAPI:
    app = FastAPI()

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                       "param": None, "code": None}}, status_code=status)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "bench"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return error(400, "messages must be a non-empty list")
        text = batcher.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = batcher.tok(text, add_special_tokens=False)["input_ids"]
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 256)
        row = Pending(prompt_ids, max_tokens, asyncio.get_running_loop(), asyncio.Queue())
        batcher.inbox.put(row)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(delta: dict, finish: Optional[str] = None, usage: Optional[dict] = None) -> str:
            payload = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name,
                       "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage:
                payload["usage"] = usage
            return f"data: {json.dumps(payload)}\n\n"

        async def events():
            while True:
                event = await row.events.get()
                yield event
                if "finish" in event or "error" in event:
                    return

        if not body.get("stream"):
            content, last = [], {}
            async for event in events():
                content.append(event.get("delta", ""))
                last = event
            if "error" in last:
                return error(500, last["error"])
            usage = {"prompt_tokens": last["prompt_tokens"], "completion_tokens": last["completion_tokens"],
                     "total_tokens": last["prompt_tokens"] + last["completion_tokens"]}
            return {"id": rid, "object": "chat.completion", "created": created, "model": model_name,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(content)},
                                 "finish_reason": last["finish"]}], "usage": usage}

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def sse():
            yield chunk({"role": "assistant", "content": ""})
            async for event in events():
                if "error" in event:
                    yield f"data: {json.dumps({'error': {'message': event['error'], 'type': 'server_error'}})}\n\n"
                    break
                if "delta" in event:
                    if event["delta"]:
                        yield chunk({"content": event["delta"]})
                    continue
                yield chunk({}, event["finish"])
                if include_usage:
                    p, c = event["prompt_tokens"], event["completion_tokens"]
                    yield chunk({}, usage={"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c})
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    return app


def dense_model(files, dtype: torch.dtype) -> LlamaForCausalLM:
    """The GGUF's weights dequantised into a plain transformers Llama, so the baseline runs the same
    bf16 matmuls radixserve does (transformers' own GGUF path keeps 4-bit weights; measured here at
    about the same speed). The dequantisation, with llama.cpp's q/k permutation undone, is
    radixserve's loader, checked against transformers by tests/test_model_parity.py."""
    c = files.config
    cfg = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                      num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                      rope_theta=c.rope_theta, max_position_embeddings=c.max_context_len,
                      tie_word_embeddings=c.tie_word_embeddings)
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(files.weights, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    return model.to(dtype).eval()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF file (default: the embedded SmolLM2 model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-timeout", type=float, default=0.5, help="seconds a batch waits to fill")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = p.parse_args()
    from radixserve.runtime.models.loader import default_model_path, load_model_files
    path = default_model_path() if args.model is None else Path(args.model)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = dense_model(load_model_files(str(path)), getattr(torch, args.dtype))
    batcher = StaticBatcher(model, tok, args.max_batch_size, args.batch_timeout)
    print(f"static batching ({args.max_batch_size} per batch, {args.batch_timeout:g} s fill timeout) "
          f"on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(build_app(batcher, path.stem), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A small decoder built from torch modules (nothing downloaded), stepped the way vLLM
decodes: static shapes, a KV cache written in place, one annotated step per token.

`profile_decode` runs `eager_steps` steps eagerly, then `graph_steps` replays of a CUDA
graph of one step (captured before profiling starts: capture under the profiler is
fragile), each inside a `record_function` named in vLLM's
`execute_context_N(T)_generation_M(T)` form, and exports the trace. On CPU there is no
graph: every step is eager.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 512
    hidden: int = 256
    heads: int = 4
    layers: int = 2
    ffn: int = 512
    max_len: int = 64
    batch: int = 4


class Layer(nn.Module):
    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.c = c
        self.norm1 = nn.LayerNorm(c.hidden)
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden, bias=False)
        self.o = nn.Linear(c.hidden, c.hidden, bias=False)
        self.norm2 = nn.LayerNorm(c.hidden)
        self.up = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x, k_cache, v_cache, pos):
        c = self.c
        b = x.shape[0]
        hd = c.hidden // c.heads
        q, k, v = self.qkv(self.norm1(x)).view(b, 1, 3, c.heads, hd).unbind(2)
        # Write this token's key and value at `pos` (a device tensor: graph-safe).
        k_cache.index_copy_(1, pos, k)
        v_cache.index_copy_(1, pos, v)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k_cache.transpose(1, 2),
                                              v_cache.transpose(1, 2))
        x = x + self.o(attn.transpose(1, 2).reshape(b, 1, c.hidden))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.layers))
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)

    def forward(self, tokens, k_caches, v_caches, pos):
        x = self.embed(tokens)
        for layer, kc, vc in zip(self.layers, k_caches, v_caches):
            x = layer(x, kc, vc, pos)
        return self.head(x).argmax(-1)


class DecodeState:
    """Static buffers of one decode batch: the step reads and writes only these."""

    def __init__(self, model: Decoder, device: str):
        c = model.c
        hd = c.hidden // c.heads
        shape = (c.batch, c.max_len, c.heads, hd)
        dtype = next(model.parameters()).dtype
        self.model = model
        self.tokens = torch.zeros(c.batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(c.layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(c.layers)]

    def step(self) -> None:
        nxt = self.model(self.tokens, self.k, self.v, self.pos)
        self.tokens.copy_(nxt)
        # Wrap inside the cache: the shapes stay static for the graph.
        self.pos.add_(1).remainder_(self.model.c.max_len)


def step_name(batch: int) -> str:
    """vLLM's annotation of a decode-only step: no prefill, `batch` requests of one token."""
    return f"execute_context_0(0)_generation_{batch}({batch})"


def build(device: str, c: DecoderConfig = DecoderConfig(), seed: int = 0) -> DecodeState:
    torch.manual_seed(seed)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = Decoder(c).to(device=device, dtype=dtype).eval()
    return DecodeState(model, device)


@torch.inference_mode()
def profile_decode(out_path: str | Path, *, device: str, eager_steps: int = 6, graph_steps: int = 6,
                   c: DecoderConfig = DecoderConfig()) -> dict:
    """Run and profile the decode steps; export the trace to `out_path`. Returns what ran."""
    from torch.profiler import ProfilerActivity, profile, record_function

    st = build(device, c)
    for _ in range(3):  # warm-up: allocations, library handles, lazy module init
        st.step()
    graph = None
    if device == "cuda":
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            st.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            st.step()
        torch.cuda.synchronize()
    else:
        graph_steps = 0
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for i in range(eager_steps + graph_steps):
            with record_function(step_name(c.batch)):
                if i < eager_steps:
                    st.step()
                else:
                    graph.replay()
                # The sampled tokens go back to the host each step, as in vLLM.
                st.tokens.to("cpu")
        if device == "cuda":
            torch.cuda.synchronize()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out_path))
    return dict(path=out_path, eager_steps=eager_steps, graph_steps=graph_steps, batch=c.batch,
                device=device)

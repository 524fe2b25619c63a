"""The vocabulary (tokenize, detokenize, pieces, special tokens) and llama.cpp's own sampler chain."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from llama_cpp import llama_cpp as _C

from mtp_cli.errors import LlamaError
from mtp_cli.llama_ext.handles import Context, Model, Sampler


def is_eog(model: Model, token: int) -> bool:
    return bool(_C.llama_vocab_is_eog(_C.llama_model_get_vocab(model), int(token)))


def eog_checker(model: Model) -> Callable[[int], bool]:
    """is_eog for one model, its vocabulary looked up once (one C call per token instead of two)."""
    vocab, check = _C.llama_model_get_vocab(model), _C.llama_vocab_is_eog
    return lambda token: bool(check(vocab, token))


def eog_tokens(model: Model) -> list[int]:
    """Every end-of-generation token of the model's vocabulary (~10 ms for 50k tokens: computed when asked)."""
    vocab = _C.llama_model_get_vocab(model)
    return [t for t in range(_C.llama_vocab_n_tokens(vocab)) if _C.llama_vocab_is_eog(vocab, t)]


def vocab_type(model: Model) -> int:
    return int(_C.llama_vocab_type(_C.llama_model_get_vocab(model)))


def vocab_special(model: Model) -> tuple[int, int]:
    """(bos, eos) token ids (-1 when the vocabulary has none)."""
    v = _C.llama_model_get_vocab(model)
    return int(_C.llama_vocab_bos(v)), int(_C.llama_vocab_eos(v))


def token_text(model: Model, token: int) -> bytes:
    """The vocabulary entry of `token` as stored (e.g. SentencePiece '\u2581the'), raw bytes."""
    return _C.llama_vocab_get_text(_C.llama_model_get_vocab(model), int(token)) or b""


class PieceDecoder:
    """token id -> its piece as bytes (llama_token_to_piece, special tokens not rendered), with a
    reusable buffer; pair with codecs' incremental UTF-8 decoder to stream text."""

    def __init__(self, model: Model, *, render_special: bool = False):
        self.vocab = _C.llama_model_get_vocab(model)
        self.special = bool(render_special)
        self.buf = ctypes.create_string_buffer(64)

    def __call__(self, token: int) -> bytes:
        n = int(_C.llama_token_to_piece(self.vocab, int(token), self.buf, len(self.buf), 0, self.special))
        if n < 0:
            self.buf = ctypes.create_string_buffer(-n + 8)
            n = int(_C.llama_token_to_piece(self.vocab, int(token), self.buf, len(self.buf), 0, self.special))
        return self.buf.raw[: max(n, 0)]


# ---------------------------------------------------------------------------------------------

DEFAULT_SEED: int = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp picks a random seed


def sampler_chain(*, top_k: int, top_p: float, min_p: float, temp: float, seed: int) -> Sampler:
    """top_k -> top_p -> min_p -> temp -> dist(seed), llama.cpp's default order for these
    samplers (common_sampler)."""
    params = _C.llama_sampler_chain_default_params()
    params.no_perf = True
    chain = _C.llama_sampler_chain_init(params)
    if not chain:
        raise LlamaError("llama_sampler_chain_init failed")
    if top_k > 0:
        _C.llama_sampler_chain_add(chain, _C.llama_sampler_init_top_k(int(top_k)))
    if top_p < 1.0:
        _C.llama_sampler_chain_add(chain, _C.llama_sampler_init_top_p(float(top_p), 1))
    if min_p > 0.0:
        _C.llama_sampler_chain_add(chain, _C.llama_sampler_init_min_p(float(min_p), 1))
    _C.llama_sampler_chain_add(chain, _C.llama_sampler_init_temp(float(temp)))
    _C.llama_sampler_chain_add(chain, _C.llama_sampler_init_dist(int(seed) & 0xFFFFFFFF))
    return Sampler(chain)


def sampler_sample(smpl: Sampler, ctx: Context, i: int) -> int:
    """Sample from the logits of batch index `i` (and let the chain accept the token)."""
    return int(_C.llama_sampler_sample(smpl, ctx, int(i)))


def tokenize(model: Model, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
    vocab = _C.llama_model_get_vocab(model)
    data = text.encode("utf-8")
    cap = len(data) + 8
    buf = (_C.llama_token * cap)()
    n = int(_C.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special))
    if n < 0:
        cap = -n
        buf = (_C.llama_token * cap)()
        n = int(_C.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special))
    if n < 0:
        raise LlamaError("llama_tokenize failed")
    return list(buf[:n])


def detokenize(model: Model, tokens: list[int], *, remove_special: bool = True, unparse_special: bool = False) -> str:
    vocab = _C.llama_model_get_vocab(model)
    arr = (_C.llama_token * max(1, len(tokens)))(*tokens)
    cap = 16 * len(tokens) + 16
    buf = ctypes.create_string_buffer(cap)
    n = int(_C.llama_detokenize(vocab, arr, len(tokens), buf, cap, remove_special, unparse_special))
    if n < 0:
        cap = -n
        buf = ctypes.create_string_buffer(cap)
        n = int(_C.llama_detokenize(vocab, arr, len(tokens), buf, cap, remove_special, unparse_special))
    if n < 0:
        raise LlamaError("llama_detokenize failed")
    return buf.raw[:n].decode("utf-8", errors="replace")


def spelled(model: Model, tokens: list[int]) -> str:
    """Tokens as text with their special tokens spelled out; ids past the vocabulary left out
    (llama.cpp aborts on them: a caller may hold ids no check has seen yet)."""
    n = int(_C.llama_vocab_n_tokens(_C.llama_model_get_vocab(model)))
    return detokenize(model, [t for t in tokens if 0 <= t < n], remove_special=False, unparse_special=True)


def chat_builtin_templates() -> list[str]:
    """The names of llama.cpp's own chat templates (rendered by chat_apply_template, without Jinja)."""
    n = int(_C.llama_chat_builtin_templates(None, 0))
    names = (ctypes.c_char_p * max(1, n))()
    n = min(n, int(_C.llama_chat_builtin_templates(names, n)))
    return [bytes(names[i] or b"").decode() for i in range(n)]


def chat_apply_template(name: str, messages: list[tuple[str, str]], add_assistant: bool) -> str:
    """Messages (role, content) through llama.cpp's built-in template `name`. Texts go as C strings:
    the caller keeps NUL characters out of them."""
    held = [(r.encode("utf-8"), c.encode("utf-8")) for r, c in messages]  # (alive through the call)
    chat = (_C.llama_chat_message * max(1, len(held)))(*[_C.llama_chat_message(r, c) for r, c in held])
    cap = 2 * sum(len(r) + len(c) for r, c in held) + 256
    for _ in range(2):
        buf = ctypes.create_string_buffer(cap)
        n = int(_C.llama_chat_apply_template(name.encode(), chat, len(held), add_assistant, buf, cap))
        if n < 0:
            raise LlamaError(f"llama.cpp has no chat template {name!r}")
        if n <= cap:
            return buf.raw[:n].decode("utf-8", errors="replace")
        cap = n
    raise LlamaError(f"chat template {name!r}: the rendered prompt did not fit")

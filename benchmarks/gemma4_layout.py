"""Do the test factory's Gemma 4 files (tests/gemma4_pair.py) have the layout llama.cpp's own
converter writes? Tiny random Gemma4ForCausalLM and Gemma4AssistantForCausalLM checkpoints of the
factory's dimensions are made with transformers, converted by convert_hf_to_gguf.py, and compared
with the factory's pair: metadata keys (name, type, and value where it describes the shape), tensor
names, shapes and types (and rope_freqs' values). The vocabulary's contents are not compared (the factory's is a tiny
SentencePiece-style one); its size is.

    python benchmarks/gemma4_layout.py --llama-cpp DIR [--keep DIR]

DIR is a llama.cpp checkout (the one llama-cpp-python==0.3.36 vendors: `pip download --no-deps
--no-binary :all: llama-cpp-python==0.3.36`, unpack, vendor/llama.cpp). Needs torch and
transformers>=5.5 (Gemma 4's classes), which mtp-cli itself does not. Exit status 0 when every
difference is one listed in EXPECTED below, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.factory import tiny_vocab  # noqa: E402
from tests.gemma4_pair import N_CTX_TRAIN, TINY, write_gemma4_pair  # noqa: E402

# Differences the factory keeps on purpose: key -> why.
EXPECTED = {
    "tokenizer.ggml.model": "the factory's tiny vocabulary is SentencePiece-style ('llama'), not gemma4's",
    "tokenizer.ggml.add_space_prefix": "goes with the tokenizer model",
}
VALUES_COMPARED = ("rope_freqs.weight",)  # the proportional rope's factors
# Keys that name or date a file rather than describe it.
IGNORED_PREFIXES = ("general.", "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
IGNORED_PREFIXES += ("tokenizer.ggml.merges", "tokenizer.chat_template")


def hf_tokenizer(folder: Path) -> None:
    """A byte-fallback BPE tokenizer.json with the factory's 300 tokens, as LlamaHfVocab reads it."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    tokens = tiny_vocab()[0]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [(t[:-1], t[-1]) for t in tokens if len(t) > 1 and not t.startswith("<") and t[:-1] in vocab]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)


def text_config(hidden: int, pattern: tuple[bool, ...], per_layer: int, shared: int):
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=len(tiny_vocab()[0]),
        hidden_size=hidden,
        intermediate_size=TINY.n_ff,
        num_hidden_layers=len(pattern),
        num_attention_heads=TINY.n_head,
        num_key_value_heads=TINY.n_head_kv,
        num_global_key_value_heads=TINY.n_head_kv,
        head_dim=TINY.head,
        global_head_dim=TINY.head_global,
        layer_types=["sliding_attention" if s else "full_attention" for s in pattern],
        sliding_window=TINY.swa,
        max_position_embeddings=N_CTX_TRAIN,
        hidden_size_per_layer_input=per_layer,
        vocab_size_per_layer_input=len(tiny_vocab()[0]) if per_layer else 0,
        num_kv_shared_layers=shared,
        pad_token_id=None,
        bos_token_id=1,
        eos_token_id=2,
    )


def write_hf(folder: Path) -> dict[str, Path]:
    import torch
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    torch.manual_seed(0)
    out = {"target": folder / "hf-target", "assistant": folder / "hf-assistant"}
    target = Gemma4ForCausalLM(text_config(TINY.n_embd, TINY.pattern, TINY.per_layer, 0))
    target.save_pretrained(out["target"])
    cfg = Gemma4AssistantConfig(
        text_config=text_config(TINY.assistant_embd, TINY.assistant_pattern, 0, len(TINY.assistant_pattern)),
        backbone_hidden_size=TINY.n_embd,
    )
    Gemma4AssistantForCausalLM(cfg).save_pretrained(out["assistant"])
    for p in out.values():
        hf_tokenizer(p)
    return out


def convert(llama_cpp: Path, hf: Path, gguf_path: Path) -> None:
    cmd = [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(hf), "--outfile", str(gguf_path)]
    r = subprocess.run(cmd + ["--outtype", "f32"], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"convert_hf_to_gguf.py failed on {hf}:\n{r.stderr[-4000:]}")


def layout(path: Path) -> tuple[dict, dict]:
    import gguf

    r = gguf.GGUFReader(path)
    kvs = {}
    for f in r.fields.values():
        if f.name.startswith(IGNORED_PREFIXES) or f.name.startswith("GGUF."):
            continue
        kvs[f.name] = (f.types[0].name if f.types else "?", _value(f))
    tensors = {t.name: (tuple(int(n) for n in t.shape), t.tensor_type.name) for t in r.tensors}
    for t in r.tensors:  # values that are structure, not weights
        if t.name in VALUES_COMPARED:
            tensors[t.name] += (t.data.tolist(),)
    return kvs, tensors


def _value(f) -> object:
    import gguf

    if not f.types:
        return None
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[-1]).decode(errors="replace")
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return f"[{len(f.data)} strings]"
        return [f.parts[i].tolist()[0] for i in f.data]
    v = f.parts[-1].tolist()[0]
    return round(v, 6) if isinstance(v, float) else v


def compare(name: str, conv: tuple[dict, dict], fact: tuple[dict, dict]) -> list[str]:
    """Lines for every difference; the unexpected ones marked '!'."""
    out = []
    (ck, ct), (fk, ft) = conv, fact
    for k in sorted(set(ck) | set(fk)):
        a, b = ck.get(k), fk.get(k)
        if a == b:
            continue
        mark = "  " if k in EXPECTED else "! "
        out.append(f"{mark}{name} key {k}: converter {a}, factory {b}" + (f" ({EXPECTED[k]})" if k in EXPECTED else ""))
    for t in sorted(set(ct) | set(ft)):
        if ct.get(t) != ft.get(t):
            out.append(f"! {name} tensor {t}: converter {ct.get(t)}, factory {ft.get(t)}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source folder")
    ap.add_argument("--keep", type=Path, help="write the checkpoints and GGUFs here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="write both layouts here")
    a = ap.parse_args()
    if not (a.llama_cpp / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"{a.llama_cpp}: no convert_hf_to_gguf.py there")
    with tempfile.TemporaryDirectory() as tmp:
        folder = a.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        hf = write_hf(folder)
        pair = write_gemma4_pair(folder / "factory")
        ours = {"target": pair.target, "assistant": pair.assistant}
        diffs, dump = [], {}
        for role in ("target", "assistant"):
            converted = folder / f"converted-{role}.gguf"
            convert(a.llama_cpp, hf[role], converted)
            conv, fact = layout(converted), layout(ours[role])
            dump[role] = {"converter": conv, "factory": fact}
            n = lambda lay: f"{len(lay[0])} keys, {len(lay[1])} tensors"  # noqa: E731
            print(f"{role}: converter {n(conv)}; factory {n(fact)}")
            diffs += compare(role, conv, fact)
        if a.json:
            a.json.write_text(json.dumps(dump, indent=1, default=str))
    print("\n".join(diffs) if diffs else "no differences")
    bad = [d for d in diffs if d.startswith("!")]
    print(f"{len(bad)} unexpected difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

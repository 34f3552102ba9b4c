"""A random-weight 2-layer Llama with a small locally trained tokenizer (~1 s to write).

Real vLLM, real scheduling, real sampling, no download: it starts in ~20-25 s on
CPU and streams 8 jobs in a fraction of a second. Its text is noise, so tests
check mechanics (counts, indices, cancel, failover, structured output), not
quality. The special tokens' rows of the output head are zeroed and the rest
scaled up, so EOS is (almost surely) never sampled and every job runs to
max_tokens: exact token counts.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
    "{% endfor %}assistant:"
)
CORPUS = [
    "The customer called about a duplicate charge on the October invoice.",
    "The agent issued a refund to the original card and confirmed by email.",
    "A parcel was delivered to the wrong address; a courier will collect it.",
    'Summaries are JSON objects like {"issue": "refund", "resolved": true, "n": 3}.',
    "Numbers 0 1 2 3 4 5 6 7 8 9 and words: yes no maybe later today tomorrow.",
]


def write_tiny_llama(out: Path, vocab_size: int = 512, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>"]
    # Metaspace (sentencepiece-style) pieces are whole characters: every token decodes to
    # valid text, as with Llama 2's tokenizer.
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    alphabet = sorted({ch for line in CORPUS for ch in line} | set("{}[]\":,0123456789 "))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", add_bos_token=True)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    n_vocab = tok.get_vocab_size()
    config = LlamaConfig(vocab_size=n_vocab, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        head = model.lm_head.weight
        head.mul_(100.0)  # logits spread ~20: sampling is near-greedy, EOS never wins
        head[: len(specials)] = 0.0
    model.save_pretrained(out, safe_serialization=True)
    return out

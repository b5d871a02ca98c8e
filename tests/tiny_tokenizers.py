"""Offline tokenizers that add BOS, EOS, both or neither: the SmolLM2 vocabulary with its
post-processor replaced (SmolLM2 itself adds nothing), so prompts tokenize realistically."""
from __future__ import annotations

BOS, EOS = "<|endoftext|>", "<|im_end|>"      # ids 0 and 2 in SmolLM2's vocabulary


def with_specials(base, bos: bool, eos: bool):
    """A PreTrainedTokenizerFast over `base`'s vocabulary whose `tok(text)` is
    [BOS]? + text tokens + [EOS]?, with `base`'s chat template (it never writes BOS)."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer.from_str(base.backend_tokenizer.to_str())
    vocab = t.get_vocab()
    single = " ".join(([BOS] if bos else []) + ["$A"] + ([EOS] if eos else []))
    t.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[(BOS, vocab[BOS]), (EOS, vocab[EOS])])
    return PreTrainedTokenizerFast(tokenizer_object=t, bos_token=BOS if bos else None, eos_token=EOS,
                                   chat_template=base.chat_template)


def ids_of(tok, *names: str) -> list[int]:
    return [tok.convert_tokens_to_ids(n) for n in names]

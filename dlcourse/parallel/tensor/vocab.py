"""Padding the vocabulary so that every tensor-parallel rank holds the same number of token ids
(lesson 04, `lessons/04_tensor_parallel.ipynb`, "What real models need").

Megatron-LM (`_vocab_size_with_padding`, flag `--make-vocab-size-divisible-by`, default 128) rounds
the vocabulary up to a multiple of make_vocab_size_divisible_by · tp: GPT-2's 50,257 ids become
50,304 at t = 1 and 51,200 at t = 8. The padded ids are rows of the embedding and columns of the
logits that no token ever uses. Megatron keeps them in the softmax (their logits are trained down,
never up); `mask_padded_logits` sets them to -inf instead, which leaves the loss exactly that of
the unpadded vocabulary.
"""

import torch


def padded_vocab_size(vocab_size, tp, divisible_by=128):
    """The smallest multiple of divisible_by · tp that is >= vocab_size."""
    for name, value in {"vocab_size": vocab_size, "tp": tp, "divisible_by": divisible_by}.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"padded_vocab_size: {name} must be a whole number >= 1, got {value!r}")
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def mask_padded_logits(logits, vocab_start, vocab_size):
    """This rank's (..., V_pad/t) logits whose columns start at id `vocab_start`, with the ids at
    or past the real `vocab_size` set to -inf: exp(-inf) = 0, so they add nothing to the softmax."""
    ids = vocab_start + torch.arange(logits.size(-1), device=logits.device)
    return logits.masked_fill(ids >= vocab_size, float("-inf"))

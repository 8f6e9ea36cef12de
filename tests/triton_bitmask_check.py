"""Run by tests/test_bitmask.py in a subprocess with TRITON_INTERPRET=1 (triton reads it when a
kernel is decorated, i.e. at import, so it cannot be switched on inside the test process): the
Triton kernel on CPU tensors against the reference. Prints each mismatch; exit status 1 if any."""
from __future__ import annotations

import os
import sys


import torch  # noqa: E402

from radixserve.kernels.bitmask import apply_token_bitmask_reference, apply_token_bitmask_triton, pack_bitmask  # noqa: E402


def main() -> int:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    gen = torch.Generator().manual_seed(0)
    failures = 0
    for vocab in (1, 31, 33, 1000):
        for extra_words in (0, 1):  # a bitmask wider than the logits, as for a padded model vocab
            words = (vocab + 31) // 32 + extra_words
            for density in (0.01, 0.5, 0.99):
                bitmask = pack_bitmask(torch.rand(4, words * 32, generator=gen) < density)
                for dtype in (torch.float32, torch.bfloat16):
                    logits = torch.randn(4, vocab, generator=gen).to(dtype)
                    for rows in (None, torch.tensor([2, 0]), [1, 3]):
                        for vocab_size in (None, max(1, vocab - 2)):
                            expected, got = logits.clone(), logits.clone()
                            apply_token_bitmask_reference(expected, bitmask, rows, vocab_size)
                            apply_token_bitmask_triton(got, bitmask, rows, vocab_size, block=256)
                            if not torch.equal(expected, got):
                                failures += 1
                                print(f"mismatch: vocab={vocab} words={words} density={density} "
                                      f"dtype={dtype} rows={rows} vocab_size={vocab_size}")
    print(f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""The CPU platform's dense linear forms compute the plain product."""
import torch
import torch.nn.functional as F

from radixserve.runtime.platform import get_platform

Linear = get_platform(torch.device("cpu")).linear


def test_bf16_linear_equals_plain_linear_for_small_and_large_batches():
    torch.manual_seed(0)
    weight = (torch.randn(96, 64) * 0.1).bfloat16()
    bias = torch.randn(96).bfloat16()
    layer = Linear([weight], bias, torch.bfloat16)
    for tokens in (1, 9, 64, 300):
        x = torch.randn(tokens, 64).bfloat16()
        torch.testing.assert_close(layer(x).float(), F.linear(x, weight, bias).float(), rtol=1e-2, atol=1e-2)


def test_float32_linear_is_plain_linear():
    weight = torch.randn(8, 4)
    x = torch.randn(3, 4)
    assert torch.equal(Linear([weight], None, torch.float32)(x), F.linear(x, weight))

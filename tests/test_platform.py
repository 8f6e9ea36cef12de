"""What each platform decides, where it can be checked without its device."""
from __future__ import annotations

import torch

from radixserve.runtime.platform import CpuPlatform, CudaPlatform, HostStaging


def test_cuda_platform_turns_tf32_off_so_float32_means_float32():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        CudaPlatform(torch.device("cuda")).prepare_process()   # sets flags; touches no device
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_cpu_staging_uploads_nothing_the_buffer_is_the_tensor():
    platform = CpuPlatform(torch.device("cpu"))
    staging = platform.staging(torch.zeros(4, 3, dtype=torch.int32))
    staging.writable()[1] = 7
    rows = staging.upload(2)
    assert rows.data_ptr() == staging.host.data_ptr() and rows.tolist() == [[0, 0, 0], [7, 7, 7]]
    assert platform.row_index([0, 3]) == [0, 3]   # the compiled CPU mask takes the list itself


def test_staging_into_a_device_tensor_copies_every_row():
    staging = HostStaging(torch.arange(6).view(2, 3), torch.device("cpu"))
    out = torch.zeros(2, 3, dtype=torch.long)
    assert staging.upload(out=out) is out and out.tolist() == [[0, 1, 2], [3, 4, 5]]

"""What each platform decides, where it can be checked without its device."""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap

import torch

from radixserve.runtime.cpu_tuning import zeroed_pages
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
    assert platform.row_index([0, 3]) == [0, 3]   # the CPU mask kernel takes the list itself


def test_staging_into_a_device_tensor_copies_every_row():
    staging = HostStaging(torch.arange(6).view(2, 3), torch.device("cpu"))
    out = torch.zeros(2, 3, dtype=torch.long)
    assert staging.upload(out=out) is out and out.tolist() == [[0, 1, 2], [3, 4, 5]]


def _resident_pages(t: torch.Tensor) -> int:
    """Pages of t's memory that are mapped (mincore), t page-aligned."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    pages = -(-t.numel() * t.element_size() // mmap.PAGESIZE)
    vec = ctypes.create_string_buffer(pages)
    assert libc.mincore(t.data_ptr(), t.numel() * t.element_size(), vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec.raw)


def test_cpu_kv_pool_is_zero_and_maps_only_the_pages_written():
    pool = zeroed_pages(48 << 20)
    assert _resident_pages(pool) == 0   # nothing resident, nothing to wait for at load
    pool[::mmap.PAGESIZE][:3] = 1
    assert _resident_pages(pool) == 3
    assert int(pool.count_nonzero()) == 3   # every other byte reads zero


def test_cpu_platform_gives_the_kv_pool_zeroed_k_and_v_of_the_asked_shape():
    k, v = CpuPlatform(torch.device("cpu")).zeroed_pair((2, 3, 4, 5), torch.bfloat16)
    assert k.shape == v.shape == (2, 3, 4, 5) and k.dtype == v.dtype == torch.bfloat16
    assert k.is_contiguous() and v.is_contiguous() and not k.any() and not v.any()
    k.fill_(1)
    assert not v.any()   # K and V do not overlap

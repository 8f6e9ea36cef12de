"""The request page table: writes land on the host and reach the device table in one copy a step."""
from __future__ import annotations

import torch

from radixserve.radix import RequestPageTable


class Uploads:
    """A platform's `upload` that counts its host-to-device copies (the "device" here is the CPU)."""

    def __init__(self):
        self.copies = 0

    def __call__(self, values, dtype: torch.dtype) -> torch.Tensor:
        self.copies += 1
        return torch.tensor(values, dtype=dtype)


def device_table(rows: int, width: int) -> RequestPageTable:
    table = RequestPageTable(rows, width, "meta")            # a device table, staged through the host
    table.table = torch.zeros(rows, width, dtype=torch.int64)  # whose values this test can read
    return table


def test_many_writes_in_a_step_reach_the_device_in_one_copy():
    table, send = device_table(4, 8), Uploads()
    table.write(0, 0, [3, 4])
    table.write(2, 0, [7])
    table.write(0, 2, [5])      # a request that grew by a page
    table.write(2, 1, [9, 10])
    table.upload(send)
    assert send.copies == 1
    assert table.table[0, :3].tolist() == [3, 4, 5] and table.table[2, :3].tolist() == [7, 9, 10]
    assert table.table[1].tolist() == [0] * 8 and table.table[3].tolist() == [0] * 8


def test_a_step_without_writes_copies_nothing():
    table, send = device_table(2, 4), Uploads()
    table.write(1, 0, [2])
    table.upload(send)
    table.upload(send)
    assert send.copies == 1


def test_on_the_cpu_the_table_is_written_in_place():
    table, send = RequestPageTable(2, 4, "cpu"), Uploads()
    table.write(1, 1, [6, 7])
    assert table.table[1].tolist() == [0, 6, 7, 0]
    table.upload(send)
    assert send.copies == 0

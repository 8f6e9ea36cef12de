"""KV page allocation and the radix tree of cached token prefixes."""
from radixserve.radix.page_pool import KVPagePool, OutOfPagesError
from radixserve.radix.radix_cache import CachedPrefix, InsertResult, RadixCache, TreeNode, common_prefix_len
from radixserve.radix.page_table import RequestPageTable
from radixserve.radix.window_pages import WindowPages

__all__ = ["CachedPrefix", "KVPagePool", "OutOfPagesError", "InsertResult", "RadixCache", "TreeNode", "RequestPageTable",
           "WindowPages", "common_prefix_len"]

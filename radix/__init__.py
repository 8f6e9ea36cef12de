"""KV page allocation and the radix tree of cached token prefixes."""
from radix.page_pool import KVPagePool, OutOfPagesError
from radix.radix_cache import RadixCache, TreeNode
from radix.page_table import RequestPageTable

__all__ = ["KVPagePool", "OutOfPagesError", "RadixCache", "TreeNode", "RequestPageTable"]

"""Discovery: traps, execution order and tensor ownership from one forward of the workload.

Modules: `patterns` (include/exclude, default stack), `hooks` (trap boundaries as events),
`reads` (tensor discovery by torch-function interception), `manual` (the offload_block hook),
`slots` (order, gaps, attribution), `ownership` (which trap owns which tensor), `driver`.
"""

from flextensor_compile.discover.driver import Discovery, DiscoveryReport, discover, is_meta_model
from flextensor_compile.discover.patterns import Selection, default_include, select_traps

__all__ = ["Discovery", "DiscoveryReport", "Selection", "default_include", "discover",
           "is_meta_model", "select_traps"]  # fmt: skip

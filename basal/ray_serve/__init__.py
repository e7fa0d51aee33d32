"""Scale-out on Ray Serve: one replica = one basal engine; a state-affinity request router in front.

Ray is an optional extra (`pip install basal-bitwise[ray]`): plain `basal serve` never imports this package. Only
`affinity` is importable without Ray (pure routing logic, unit-tested on its own).
"""

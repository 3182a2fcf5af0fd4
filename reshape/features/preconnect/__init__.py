"""Preconnect: learn which origins a page needs, so that warm connections wait for the next load.

`navigations` groups the requests a proxy sees into page loads (sans-IO), `table` learns from
finished page loads and predicts (sans-IO), `store` keeps the table in the confdir and shares it
between the workers of one proxy. The addon (reshape/features/preconnect/addon.py) wires them to
traffic and
asks the upstream engine for warm connections.
"""

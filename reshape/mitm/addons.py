"""Which of mitmproxy's own addons a reshape process loads.

mitmproxy 12.2.3's `default_addons()` is 31 addons built for an interactive tool (flow export,
replay, map local/remote, HAR saving, sticky cookies, ...). Every hook of every request visits
each of them (AddonManager walks the whole chain, through a context manager per addon), and on
this machine that walk was about a fifth of reshape's CPU per request (py-spy, 1 KB responses).
reshape uses none of those features, so it loads only the addons that make mitmproxy a proxy.

Checked against mitmproxy 12.2.3: the options reshape sets (runtime.py) and the options these
addons read are all declared by addons in this list.
"""

from __future__ import annotations

from typing import Any

from mitmproxy.addons import (
    block,
    core,
    disable_h2c,
    dns_resolver,
    next_layer,
    proxyauth,
    proxyserver,
    tlsconfig,
)


def proxy_addons() -> list[Any]:
    return [
        core.Core(),  # options and commands every other addon relies on
        block.Block(),  # declares block_global; ClientAccess decides who may connect
        disable_h2c.DisableH2C(),  # refuses h2c upgrades and prior-knowledge h2 over cleartext
        proxyauth.ProxyAuth(),  # declares the proxyauth option (off unless set)
        proxyserver.Proxyserver(),  # the listeners and connection handling
        dns_resolver.DnsResolver(),  # name resolution settings (dns_name_servers, hosts file)
        next_layer.NextLayer(),  # decides TLS / HTTP / raw TCP per connection
        tlsconfig.TlsConfig(),  # certificates for clients, verification of origins
    ]

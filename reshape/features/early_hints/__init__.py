"""Early hints: tell the browser in a 103, before the HTML, what earlier loads of a page needed.

`learning` groups a client's requests into page loads and learns, per document URL, the
resources to preload and the origins to preconnect to (sans-IO). The addon
(reshape/features/early_hints/addon.py) feeds it requests and puts the Link values for a
document request on the flow; the patch `SendEarlyHints` (reshape/mitm/patches/early_hints.py)
writes the 103 to the client.
"""

"""The onboarding site's routes, sans-IO: a path in, a reply out.

Served twice with the same answers: by the admin endpoint (reshape/app/admin.py) and, through
the proxy, at the well-known name by the onboarding addon (addon.py).

| path | reply |
| --- | --- |
| `/` | the onboarding page (page.py) |
| `/cert/pem`, `/cert/cer`, `/cert/p12` | the CA certificate in that form, as a download |
"""

from __future__ import annotations

from dataclasses import dataclass

from reshape.base.addresses import ListenAddress
from reshape.features.onboarding.downloads import CaDownloads
from reshape.features.onboarding.page import onboarding_page

CERT_PREFIX = "/cert/"


def reachable_at(listen: ListenAddress, reached_host: str) -> ListenAddress | None:
    """`listen` as a client that reached this machine at `reached_host` can use it: a wildcard
    listener at that same host; None if `listen` is loopback and the client came from elsewhere."""
    reached = ListenAddress(reached_host, listen.port)
    if listen.is_wildcard:
        return reached
    if listen.is_loopback and not reached.is_loopback:
        return None
    return listen


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class OnboardingSite:
    """The page and the downloads of one CA."""

    downloads: CaDownloads

    @property
    def paths(self) -> tuple[str, ...]:
        return ("/", *(CERT_PREFIX + form for form in self.downloads.forms))

    def reply(self, path: str, proxy: str, pac_url: str | None = None) -> Reply | None:
        """The reply for `path` (query string already removed), the page naming the proxy as the
        client reached it (HOST:PORT) and the PAC file's URL if the client can reach it; None if
        `path` is not the site's."""
        if path == "/":
            page = onboarding_page(self.downloads, proxy, pac_url)
            return Reply(200, {"Content-Type": "text/html; charset=utf-8"}, page)
        if path.startswith(CERT_PREFIX):
            download = self.downloads.forms.get(path.removeprefix(CERT_PREFIX))
            if download is not None:
                return Reply(
                    200,
                    {
                        "Content-Type": download.content_type,
                        "Content-Disposition": f'attachment; filename="{download.filename}"',
                    },
                    download.body,
                )
        return None

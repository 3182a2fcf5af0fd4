"""The onboarding page: how to point a browser at reshape and trust its CA, per OS and browser.

One self-contained HTML document (inline style, no script, nothing fetched from elsewhere), so it
renders the same from the admin address, through the proxy at its well-known name, or saved to a
file. Links to the certificate are relative (`cert/pem`, …): they work wherever the page is
served. The steps follow mitmproxy's own onboarding page (mitm.it), adapted to reshape's names
and with Chromium's and Linux's own stores spelled out.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from string import Template

from reshape.features.onboarding.downloads import FILE_STEM, CaDownloads


@dataclass(frozen=True)
class Platform:
    """One OS or browser: the form of the certificate it imports and the steps, as HTML."""

    key: str
    title: str
    form: str
    steps: str


PLATFORMS = (
    Platform(
        "chromium",
        "Chromium / Chrome",
        "pem",
        """
<p>On Windows and macOS, Chrome and Edge use the operating system's store: follow the steps for
Windows or macOS. On Linux they keep their own (NSS) database:</p>
<ol>
  <li><code>certutil -d sql:$$HOME/.pki/nssdb -A -t "C,," -n reshape -i $stem.pem</code>
      (Debian: <code>apt install libnss3-tools</code>), or</li>
  <li>Settings &rarr; Privacy and security &rarr; Security &rarr; Manage certificates &rarr;
      Authorities &rarr; Import, pick <samp>$stem.pem</samp>, tick
      <samp>Trust this certificate for identifying websites</samp>.</li>
</ol>
<p>Restart the browser. Headless or scripted Chromium: <code>--proxy-server=http://$proxy</code>;
loopback origins need <code>--proxy-bypass-list='&lt;-loopback&gt;'</code> too.</p>""",
    ),
    Platform(
        "firefox",
        "Firefox",
        "pem",
        """
<p>Firefox has its own store on every operating system.</p>
<ol>
  <li>Settings &rarr; Privacy &amp; Security &rarr; Certificates &rarr;
      <samp>View Certificates&hellip;</samp> &rarr; Authorities &rarr;
      <samp>Import&hellip;</samp></li>
  <li>Pick <samp>$stem.pem</samp> and tick <samp>Trust this CA to identify websites</samp>.</li>
</ol>
<p>Scripted: <code>certutil -d sql:PROFILE_DIR -A -t "C,," -n reshape -i $stem.pem</code>.</p>""",
    ),
    Platform(
        "android",
        "Android",
        "cer",
        """
<ol>
  <li>Download <samp>$stem.cer</samp>.</li>
  <li>Settings &rarr; Security &rarr; More security settings &rarr; Encryption &amp; credentials
      &rarr; Install a certificate &rarr; CA certificate; pick the file and confirm.</li>
</ol>
<p class="warn">Chrome on Android trusts user-installed CAs; most apps (target API 24 and later)
do not, unless they opt in with a network security configuration.</p>""",
    ),
    Platform(
        "ios",
        "iOS / iPadOS",
        "pem",
        """
<ol>
  <li>Open this page in <strong>Safari</strong> and download <samp>$stem.pem</samp>; allow the
      configuration profile.</li>
  <li>Settings &rarr; General &rarr; VPN &amp; Device Management &rarr; the downloaded profile
      &rarr; Install.</li>
  <li class="warn">Then Settings &rarr; General &rarr; About &rarr; Certificate Trust Settings:
      turn on full trust for <samp>reshape interception CA</samp>. Without this step HTTPS
      through reshape fails.</li>
</ol>""",
    ),
    Platform(
        "windows",
        "Windows",
        "p12",
        """
<ol>
  <li>Double-click <samp>$stem.p12</samp>; choose Current User (or Local Machine for everyone),
      Next, Next, leave the password empty, Next.</li>
  <li>Choose <samp>Place all certificates in the following store</samp> &rarr; Browse &rarr;
      <samp>Trusted Root Certification Authorities</samp> &rarr; OK, Next, Finish, and confirm
      the warning with Yes.</li>
</ol>
<p>Scripted (as administrator): <code>certutil.exe -addstore root $stem.cer</code>.
Chrome and Edge use this store.</p>""",
    ),
    Platform(
        "macos",
        "macOS",
        "pem",
        """
<ol>
  <li>Double-click <samp>$stem.pem</samp>: Keychain Access adds it to the login keychain.</li>
  <li>Open <samp>reshape interception CA</samp> there, expand Trust, set
      <samp>When using this certificate</samp> to <samp>Always Trust</samp>, close and enter
      your password.</li>
</ol>
<p>Scripted: <code>sudo security add-trusted-cert -d -r trustRoot -k
/Library/Keychains/System.keychain $stem.pem</code>. Safari and Chrome use this store.</p>""",
    ),
    Platform(
        "linux",
        "Linux (system store)",
        "pem",
        """
<p>For curl, Python, Go and other programs that read the system's CA bundle (Chromium and
Firefox keep their own: see above).</p>
<ul>
  <li>Debian / Ubuntu: <code>sudo cp $stem.pem /usr/local/share/ca-certificates/reshape.crt
      &amp;&amp; sudo update-ca-certificates</code></li>
  <li>Fedora / RHEL: <code>sudo cp $stem.pem /etc/pki/ca-trust/source/anchors/
      &amp;&amp; sudo update-ca-trust</code></li>
  <li>Arch: <code>sudo trust anchor --store $stem.pem</code></li>
  <li>One command only: <code>curl --cacert $stem.pem -x http://$proxy https://&hellip;</code></li>
</ul>""",
    ),
)

_PAGE = Template("""\
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>reshape: install the CA</title>
<style>
body { font: 16px/1.5 system-ui, sans-serif; max-width: 52rem; margin: 2rem auto;
       padding: 0 1rem; color: #1d2330; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
code, samp { font: .9em ui-monospace, monospace; background: #eef1f6; padding: 0 .2em; }
.formats a { display: inline-block; margin: .2rem .4rem .2rem 0; padding: .45rem .9rem;
             background: #2f6fd0; color: #fff; border-radius: .3rem; text-decoration: none; }
details { border: 1px solid #cfd6e2; border-radius: .3rem; margin: .5rem 0; padding: .3rem .8rem; }
summary { cursor: pointer; font-weight: 600; }
.form { font-weight: normal; color: #555; }
.warn { color: #8a3b00; }
.fingerprint { word-break: break-all; }
</style>
</head>
<body>
<h1>Install reshape's certificate authority</h1>
<p>reshape intercepts HTTPS with a certificate authority of its own, created on this proxy's first
run and shared with no other installation. Browsers accept pages through reshape only once they
trust it.</p>
<p class="formats">
<a id="get-pem" href="cert/pem" download="$stem.pem">$stem.pem</a>
<a id="get-cer" href="cert/cer" download="$stem.cer">$stem.cer</a>
<a id="get-p12" href="cert/p12" download="$stem.p12">$stem.p12</a>
</p>
<p>Check what you install: subject <samp>$subject</samp>, SHA-256 fingerprint
<samp class="fingerprint">$fingerprint</samp>.</p>
$platforms
<h2>Point the browser at the proxy</h2>
<p>HTTP proxy <code>$proxy</code> for HTTP and HTTPS$pac.</p>
<p class="warn">Whoever holds this CA's key can impersonate any site to a browser that trusts it.
Remove it from every store when you stop using reshape.</p>
</body>
</html>
""")

_PLATFORM = Template("""\
<details id="$key">
<summary>$title <span class="form">($form)</span></summary>
$steps
</details>""")


def onboarding_page(downloads: CaDownloads, proxy: str, pac_url: str | None = None) -> bytes:
    """The page, for a proxy reached at `proxy` (HOST:PORT) and a PAC file at `pac_url`."""
    values = {"stem": FILE_STEM, "proxy": escape(proxy)}
    platforms = "\n".join(
        _PLATFORM.substitute(
            key=p.key,
            title=escape(p.title),
            form=f"{FILE_STEM}.{p.form}",
            steps=Template(p.steps).substitute(values),
        )
        for p in PLATFORMS
    )
    pac = f", or the automatic configuration URL <code>{escape(pac_url)}</code>" if pac_url else ""
    return _PAGE.substitute(
        values,
        subject=escape(downloads.subject),
        fingerprint=downloads.sha256_fingerprint,
        platforms=platforms,
        pac=pac,
    ).encode()

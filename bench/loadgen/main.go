// Command loadgen is a closed-loop HTTP/1.1 and HTTP/2 load generator for bench/overhead.
//
// HTTP/1.1 (the default): each of -c workers owns exactly one keep-alive connection (direct,
// through an HTTP proxy in absolute form, or through a CONNECT tunnel for https) and sends one GET
// at a time on it. Every response is checked (status and body length); a failed request is
// counted as an error and is never retried. A connection closed by the peer is re-opened, and
// re-opens are reported, so a proxy that drops keep-alive shows up in the output rather than
// hiding in the latencies. This client is written on net.Conn rather than http.Transport because
// the Transport silently replays idempotent requests that fail on a reused connection, and pools
// connections on its own.
//
// HTTP/2 (-h2, https only): a browser's model, -c connections with -streams requests in flight on
// each (one worker per stream). Each connection is its own http.Transport limited to one
// connection, dialled here (through the CONNECT tunnel when there is a proxy) with ALPN h2 only;
// a server that does not choose h2 is an error, not a silent HTTP/1.1 run. Go's HTTP/2 client
// retries on its own only requests the server did not process (REFUSED_STREAM, streams above a
// GOAWAY's last one); every dial is counted in `connects`, so a proxy that drops connections
// still shows.
//
// Output: one JSON object on stdout.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

type config struct {
	target      *url.URL
	proxy       *url.URL
	connections int
	duration    time.Duration
	maxRequests int64
	warmup      time.Duration
	timeout     time.Duration
	status      int
	size        int64
	tls         *tls.Config
	h2          bool
	streams     int
}

type latencyMS struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

type report struct {
	URL           string    `json:"url"`
	Proxy         string    `json:"proxy"`
	Connections   int       `json:"connections"`
	Protocol      string    `json:"protocol"`
	Streams       int       `json:"streams"`
	DurationS     float64   `json:"duration_s"`
	Requests      int64     `json:"requests"`
	Errors        int64     `json:"errors"`
	WarmupErrors  int64     `json:"warmup_errors"`
	RPS           float64   `json:"rps"`
	Latency       latencyMS `json:"latency_ms"`
	Bytes         int64     `json:"bytes"`
	Connects      int64     `json:"connects"`
	ErrorSamples  []string  `json:"error_samples"`
	StoppedByMaxN bool      `json:"stopped_by_max_requests"`
}

// run is the shared state of one load run; workers only touch it through the methods below.
type run struct {
	cfg          config
	measureStart time.Time
	measureEnd   time.Time
	stop         atomic.Bool
	attempts     atomic.Int64
	errors       atomic.Int64
	warmupErrors atomic.Int64
	bytes        atomic.Int64
	connects     atomic.Int64

	mu           sync.Mutex
	latencies    []time.Duration
	errorSamples []string
	stoppedAt    time.Time
}

const maxErrorSamples = 5

// admit counts a request that completed at `end` against the measurement window and -n. It
// reports whether the request is inside the window; the run stops once -n requests are admitted.
func (r *run) admit(end time.Time) bool {
	if end.Before(r.measureStart) || end.After(r.measureEnd) {
		return false
	}
	count := r.attempts.Add(1)
	if count > r.cfg.maxRequests {
		r.stop.Store(true)
		return false
	}
	if count == r.cfg.maxRequests {
		r.mu.Lock()
		r.stoppedAt = end
		r.mu.Unlock()
		r.stop.Store(true)
	}
	return true
}

func (r *run) recordError(end time.Time, err error) {
	if r.admit(end) {
		r.errors.Add(1)
	} else if end.Before(r.measureStart) {
		r.warmupErrors.Add(1)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errorSamples) < maxErrorSamples {
		r.errorSamples = append(r.errorSamples, err.Error())
	}
}

func (r *run) recordSuccess(end time.Time, latency time.Duration, n int64, local []time.Duration) []time.Duration {
	if !r.admit(end) {
		return local
	}
	r.bytes.Add(n)
	return append(local, latency)
}

func (r *run) done(now time.Time) bool {
	return r.stop.Load() || !now.Before(r.measureEnd)
}

// conn is one worker's connection, opened lazily.
type conn struct {
	raw net.Conn
	br  *bufio.Reader
	bw  *bufio.Writer
}

func (c *conn) close() {
	if c.raw != nil {
		c.raw.Close()
	}
	*c = conn{}
}

func (r *run) dial() (*conn, error) {
	r.connects.Add(1)
	cfg := r.cfg
	addr := hostPort(cfg.target)
	if cfg.proxy != nil {
		addr = hostPort(cfg.proxy)
	}
	raw, err := net.DialTimeout("tcp", addr, cfg.timeout)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c := &conn{raw: raw, br: bufio.NewReader(raw), bw: bufio.NewWriter(raw)}
	if cfg.target.Scheme != "https" {
		return c, nil
	}
	raw.SetDeadline(time.Now().Add(cfg.timeout))
	if cfg.proxy != nil {
		if err := c.connectTunnel(hostPort(cfg.target)); err != nil {
			c.close()
			return nil, err
		}
	}
	tc := tls.Client(raw, cfg.tls.Clone())
	if err := tc.Handshake(); err != nil {
		c.close()
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	raw.SetDeadline(time.Time{})
	c.raw, c.br, c.bw = tc, bufio.NewReader(tc), bufio.NewWriter(tc)
	return c, nil
}

func (c *conn) connectTunnel(authority string) error {
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: authority},
		Host:   authority,
		Header: http.Header{},
	}
	if err := req.Write(c.bw); err != nil {
		return fmt.Errorf("CONNECT write: %w", err)
	}
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("CONNECT write: %w", err)
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil {
		return fmt.Errorf("CONNECT response: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("CONNECT %s: status %d", authority, resp.StatusCode)
	}
	if c.br.Buffered() != 0 {
		return errors.New("CONNECT: proxy sent bytes before the TLS handshake")
	}
	return nil
}

// do sends one request on c and reads the whole response, checking status and length.
// It reports whether the connection can be reused.
func (r *run) do(c *conn) (int64, bool, error) {
	cfg := r.cfg
	req := &http.Request{
		Method:     http.MethodGet,
		URL:        cfg.target,
		Host:       cfg.target.Host,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     http.Header{"User-Agent": {"reshape-bench-loadgen"}},
	}
	c.raw.SetDeadline(time.Now().Add(cfg.timeout))
	var err error
	if cfg.proxy != nil && cfg.target.Scheme == "http" {
		err = req.WriteProxy(c.bw)
	} else {
		err = req.Write(c.bw)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		return 0, false, fmt.Errorf("write request: %w", err)
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil {
		return 0, false, fmt.Errorf("read response: %w", err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return n, false, fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode != cfg.status {
		return n, false, fmt.Errorf("status %d, want %d", resp.StatusCode, cfg.status)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, false, fmt.Errorf("body %d bytes, Content-Length %d", n, resp.ContentLength)
	}
	if cfg.size >= 0 && n != cfg.size {
		return n, false, fmt.Errorf("body %d bytes, want %d", n, cfg.size)
	}
	return n, !resp.Close, nil
}

func (r *run) worker() []time.Duration {
	var local []time.Duration
	c := &conn{}
	defer c.close()
	for !r.done(time.Now()) {
		start := time.Now()
		if c.raw == nil {
			opened, err := r.dial()
			if err != nil {
				r.recordError(time.Now(), err)
				// A refused or failing dial would otherwise spin; the pause is not a retry of
				// the failed request, which stays counted.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			*c = *opened
		}
		n, reusable, err := r.do(c)
		end := time.Now()
		if err != nil {
			r.recordError(end, err)
			c.close()
			continue
		}
		if !reusable {
			c.close()
		}
		local = r.recordSuccess(end, end.Sub(start), n, local)
	}
	return local
}

// h2Client is one HTTP/2 connection's client: a Transport that opens at most one connection,
// dialled by dialH2 (a new one only if the last was lost).
func (r *run) h2Client() *http.Client {
	transport := &http.Transport{
		ForceAttemptHTTP2:  true,
		MaxConnsPerHost:    1,
		DisableCompression: true,
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return r.dialH2()
		},
	}
	return &http.Client{Transport: transport, Timeout: r.cfg.timeout}
}

func (r *run) dialH2() (net.Conn, error) {
	c, err := r.dial()
	if err != nil {
		return nil, err
	}
	tc, ok := c.raw.(*tls.Conn)
	if !ok {
		c.close()
		return nil, errors.New("-h2: not a TLS connection")
	}
	if proto := tc.ConnectionState().NegotiatedProtocol; proto != "h2" {
		c.close()
		return nil, fmt.Errorf("-h2: the server chose %q, not h2", proto)
	}
	return tc, nil
}

// doH2 sends one GET on client and reads the whole response, checking status and length.
func (r *run) doH2(client *http.Client) (int64, error) {
	cfg := r.cfg
	req, err := http.NewRequest(http.MethodGet, cfg.target.String(), nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("User-Agent", "reshape-bench-loadgen")
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("request: %w", err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return n, fmt.Errorf("read body: %w", err)
	}
	if resp.ProtoMajor != 2 {
		return n, fmt.Errorf("response over %s, not HTTP/2", resp.Proto)
	}
	if resp.StatusCode != cfg.status {
		return n, fmt.Errorf("status %d, want %d", resp.StatusCode, cfg.status)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("body %d bytes, Content-Length %d", n, resp.ContentLength)
	}
	if cfg.size >= 0 && n != cfg.size {
		return n, fmt.Errorf("body %d bytes, want %d", n, cfg.size)
	}
	return n, nil
}

// h2Worker is one stream's closed loop on a shared HTTP/2 connection.
func (r *run) h2Worker(client *http.Client) []time.Duration {
	var local []time.Duration
	for !r.done(time.Now()) {
		start := time.Now()
		n, err := r.doH2(client)
		end := time.Now()
		if err != nil {
			r.recordError(end, err)
			// A refused dial would otherwise spin; the failed request stays counted.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		local = r.recordSuccess(end, end.Sub(start), n, local)
	}
	return local
}

func (r *run) execute() report {
	var wg sync.WaitGroup
	perConnection := 1
	if r.cfg.h2 {
		perConnection = r.cfg.streams
	}
	results := make([][]time.Duration, r.cfg.connections*perConnection)
	for i := 0; i < r.cfg.connections; i++ {
		var client *http.Client
		if r.cfg.h2 {
			client = r.h2Client()
		}
		for j := 0; j < perConnection; j++ {
			wg.Add(1)
			go func(slot int) {
				defer wg.Done()
				if client != nil {
					results[slot] = r.h2Worker(client)
				} else {
					results[slot] = r.worker()
				}
			}(i*perConnection + j)
		}
	}
	wg.Wait()

	var all []time.Duration
	for _, l := range results {
		all = append(all, l...)
	}
	end := r.measureEnd
	stoppedByN := !r.stoppedAt.IsZero()
	if stoppedByN {
		end = r.stoppedAt
	}
	elapsed := end.Sub(r.measureStart).Seconds()
	rep := report{
		URL:           r.cfg.target.String(),
		Connections:   r.cfg.connections,
		Protocol:      "HTTP/1.1",
		Streams:       perConnection,
		DurationS:     elapsed,
		Requests:      int64(len(all)),
		Errors:        r.errors.Load(),
		WarmupErrors:  r.warmupErrors.Load(),
		Bytes:         r.bytes.Load(),
		Connects:      r.connects.Load(),
		ErrorSamples:  r.errorSamples,
		StoppedByMaxN: stoppedByN,
		Latency:       percentiles(all),
	}
	if rep.ErrorSamples == nil {
		rep.ErrorSamples = []string{}
	}
	if r.cfg.h2 {
		rep.Protocol = "HTTP/2"
	}
	if r.cfg.proxy != nil {
		rep.Proxy = r.cfg.proxy.String()
	}
	if elapsed > 0 {
		rep.RPS = float64(rep.Requests) / elapsed
	}
	return rep
}

func percentiles(all []time.Duration) latencyMS {
	if len(all) == 0 {
		return latencyMS{}
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	at := func(q float64) float64 {
		i := int(q*float64(len(all))+0.5) - 1
		if i < 0 {
			i = 0
		}
		if i >= len(all) {
			i = len(all) - 1
		}
		return ms(all[i])
	}
	var sum time.Duration
	for _, d := range all {
		sum += d
	}
	return latencyMS{
		P50:  at(0.50),
		P90:  at(0.90),
		P99:  at(0.99),
		Max:  ms(all[len(all)-1]),
		Mean: ms(sum / time.Duration(len(all))),
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

func parseFlags() (config, error) {
	target := flag.String("url", "", "URL to GET (http or https)")
	proxy := flag.String("proxy", "", "HTTP forward proxy, http://host:port (optional)")
	c := flag.Int("c", 10, "connections (one worker each, one request in flight per connection)")
	d := flag.Duration("d", 10*time.Second, "measured duration")
	n := flag.Int64("n", 1_000_000, "stop after this many measured requests (errors included)")
	warmup := flag.Duration("warmup", time.Second, "load before measuring, not counted")
	timeout := flag.Duration("timeout", 10*time.Second, "per dial, handshake and request")
	status := flag.Int("status", 200, "expected response status")
	size := flag.Int64("size", -1, "expected body length in bytes (-1: Content-Length only)")
	cacert := flag.String("cacert", "", "PEM file of roots for TLS verification (https)")
	useH2 := flag.Bool("h2", false, "HTTP/2 (https only): -streams requests in flight per connection")
	streams := flag.Int("streams", 1, "with -h2: requests in flight on each connection")
	flag.Parse()

	cfg := config{
		connections: *c, duration: *d, maxRequests: *n, warmup: *warmup,
		timeout: *timeout, status: *status, size: *size, h2: *useH2, streams: *streams,
	}
	u, err := url.Parse(*target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return cfg, fmt.Errorf("-url: need an absolute http(s) URL, got %q", *target)
	}
	cfg.target = u
	if *proxy != "" {
		p, err := url.Parse(*proxy)
		if err != nil || p.Scheme != "http" || p.Host == "" {
			return cfg, fmt.Errorf("-proxy: need http://host:port, got %q", *proxy)
		}
		cfg.proxy = p
	}
	if cfg.connections < 1 || cfg.duration <= 0 || cfg.maxRequests < 1 || cfg.warmup < 0 {
		return cfg, errors.New("-c, -d and -n must be positive, -warmup not negative")
	}
	if cfg.streams < 1 || (cfg.streams > 1 && !cfg.h2) {
		return cfg, errors.New("-streams: a positive number, above 1 only with -h2")
	}
	if cfg.h2 && u.Scheme != "https" {
		return cfg, errors.New("-h2: needs an https URL (h2 is negotiated with ALPN)")
	}
	nextProtos := []string{"http/1.1"}
	if cfg.h2 {
		nextProtos = []string{"h2"}
	}
	if u.Scheme == "https" {
		roots, err := x509.SystemCertPool()
		if err != nil || *cacert != "" {
			roots = x509.NewCertPool()
		}
		if *cacert != "" {
			pem, err := os.ReadFile(*cacert)
			if err != nil {
				return cfg, fmt.Errorf("-cacert: %w", err)
			}
			if !roots.AppendCertsFromPEM(pem) {
				return cfg, fmt.Errorf("-cacert: no certificates in %s", *cacert)
			}
		}
		cfg.tls = &tls.Config{
			RootCAs:    roots,
			ServerName: u.Hostname(),
			NextProtos: nextProtos,
		}
	}
	return cfg, nil
}

func main() {
	cfg, err := parseFlags()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	now := time.Now()
	r := &run{cfg: cfg, measureStart: now.Add(cfg.warmup)}
	r.measureEnd = r.measureStart.Add(cfg.duration)
	rep := r.execute()
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

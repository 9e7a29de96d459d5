package executor

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// apiPath is where the forge serves its runner API (Gitea's RunnerService and PingService,
// below the forge's own path): the only requests of the runner that go to the facade.
const apiPath = "/api/actions/"

// proxy is the runner's way out of the environment, listening on loopback. It serves two
// kinds of request:
//
//   - As the HTTP proxy of the runner process alone (HTTP_PROXY or HTTPS_PROXY in the runner's
//     environment, with credentials, masked for its jobs). The runner is registered with the
//     forge's own URL, so its jobs see that URL; the proxy sends the runner's runner-API calls
//     to the forge's host to the facade over mTLS and passes everything else on unchanged: to
//     the forge itself, or as a tunnel to any other host. For an https forge the proxy ends the
//     runner's TLS to the forge's host itself (the runner skips verifying that hop, which never
//     leaves loopback) and verifies the forge's certificate on the way out.
//   - As a forwarder (origin-form requests), for a forge on a loopback address, which Go's
//     proxy support never proxies: the runner is then registered with the forwarder's URL, the
//     runner API goes to the facade and every other path to the forge.
//
// It never adds a credential to a request: what reaches the forge carries only what the
// runner or the job sent.
type proxy struct {
	forge     *url.URL // nil when the forge is unknown
	forgeHost string   // forge host:port
	user      string
	pass      string
	toFacade  *httputil.ReverseProxy
	toForge   *httputil.ReverseProxy
	onward    *httputil.ReverseProxy // absolute-form requests to other hosts
	dialer    net.Dialer
	upstream  func(*http.Request) (*url.URL, error) // the environment's own proxy settings
	cert      tls.Certificate                       // the forge's host, for the runner's hop
	log       zerolog.Logger

	ln    net.Listener
	srv   *http.Server
	inner *http.Server // serves the runner's requests inside a CONNECT to an https forge
	conns *connListener

	mu      sync.Mutex
	tunnels map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// proxyConfig configures startProxy.
type proxyConfig struct {
	Facade *url.URL
	// FacadeTransport dials the facade (mTLS with the environment's SVID, or the guest's
	// pinned TLS).
	FacadeTransport http.RoundTripper
	// Forge is the forge's own URL; nil when unknown (the forwarder then serves the runner
	// API only).
	Forge *url.URL
	// Upstream is the transport to the forge and to other hosts: system roots, the
	// environment's own proxy settings.
	Upstream *http.Transport
	Log      zerolog.Logger
}

func startProxy(cfg proxyConfig) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("executor: proxy: %w", err)
	}
	p := &proxy{
		forge: cfg.Forge, user: "dynrunner", pass: randomHex(16), log: cfg.Log,
		dialer:   net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second},
		upstream: cfg.Upstream.Proxy, ln: ln, conns: newConnListener(ln.Addr()),
		tunnels: map[net.Conn]struct{}{},
	}
	if p.upstream == nil {
		p.upstream = func(*http.Request) (*url.URL, error) { return nil, nil }
	}
	fail := func(what string) func(http.ResponseWriter, *http.Request, error) {
		return func(w http.ResponseWriter, r *http.Request, err error) {
			p.log.Warn().Err(err).Str("path", r.URL.Path).Msg(what + " unreachable")
			http.Error(w, "dynrunner executor: "+what+" unreachable", http.StatusBadGateway)
		}
	}
	p.toFacade = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host, r.Out.Host = cfg.Facade.Scheme, cfg.Facade.Host, cfg.Facade.Host
			// The facade serves the runner API at its root, whatever path the forge has: the
			// method is what follows apiPath (below the forge's path through the proxy, the
			// root through the forwarder).
			_, method, _ := strings.Cut(r.Out.URL.Path, apiPath)
			r.Out.URL.Path = strings.TrimRight(cfg.Facade.Path, "/") + apiPath + method
			r.Out.URL.RawPath = ""
		},
		Transport: cfg.FacadeTransport, ErrorHandler: fail("facade"),
	}
	if p.forge != nil {
		p.forgeHost = hostPort(p.forge)
		p.toForge = &httputil.ReverseProxy{
			Rewrite: func(r *httputil.ProxyRequest) {
				r.Out.URL.Scheme, r.Out.URL.Host, r.Out.Host = p.forge.Scheme, p.forge.Host, p.forge.Host
			},
			Transport: cfg.Upstream, ErrorHandler: fail("forge"),
		}
		if p.forge.Scheme == "https" {
			if p.cert, err = selfSigned(p.forge.Hostname()); err != nil {
				ln.Close()
				return nil, err
			}
		}
	}
	p.onward = &httputil.ReverseProxy{Rewrite: func(*httputil.ProxyRequest) {}, Transport: cfg.Upstream, ErrorHandler: fail("destination")}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 30 * time.Second}
	p.inner = &http.Server{Handler: http.HandlerFunc(p.serveForge), ReadHeaderTimeout: 30 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{p.cert}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12},
		// HTTP/1.1 only: the runner's transport speaks nothing else through a proxy.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
	p.wg.Add(2)
	go func() { defer p.wg.Done(); _ = p.srv.Serve(ln) }()
	go func() { defer p.wg.Done(); _ = p.inner.Serve(p.conns) }()
	return p, nil
}

// URL is the forwarder's URL, for a runner registered with it.
func (p *proxy) URL() string { return "http://" + p.ln.Addr().String() }

// ProxyURL is the proxy's URL with its credentials, for the runner's HTTP(S)_PROXY.
func (p *proxy) ProxyURL() string {
	return (&url.URL{Scheme: "http", User: url.UserPassword(p.user, p.pass), Host: p.ln.Addr().String()}).String()
}

// Close stops serving and cuts open tunnels; it is idempotent.
func (p *proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	for c := range p.tunnels {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.srv.Close()
	_ = p.inner.Close()
	p.wg.Wait()
}

// apiPrefix is the path of the runner API below the forge's path, as the runner addresses it
// through the proxy.
func (p *proxy) apiPrefix() string {
	if p.forge == nil {
		return apiPath
	}
	return strings.TrimRight(p.forge.Path, "/") + apiPath
}

func (p *proxy) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodConnect:
		if p.authorized(w, r) {
			p.connect(w, r)
		}
	case r.URL.IsAbs():
		if !p.authorized(w, r) {
			return
		}
		if p.forge != nil && p.forge.Scheme == "http" && strings.EqualFold(hostPort(r.URL), p.forgeHost) {
			p.serveForge(w, r)
			return
		}
		p.onward.ServeHTTP(w, r)
	default:
		p.forward(w, r)
	}
}

// serveForge routes a request of the runner to the forge's host: the runner API to the
// facade, anything else to the forge.
func (p *proxy) serveForge(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, p.apiPrefix()) {
		p.toFacade.ServeHTTP(w, r)
		return
	}
	if p.toForge == nil {
		http.Error(w, "dynrunner executor: no forge to forward to", http.StatusNotFound)
		return
	}
	p.toForge.ServeHTTP(w, r)
}

// forward serves the forwarder: origin-form requests to the runner's registered address when
// that is the forwarder itself.
func (p *proxy) forward(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, apiPath) {
		p.toFacade.ServeHTTP(w, r)
		return
	}
	if p.toForge == nil {
		http.Error(w, "dynrunner executor: no forge to forward to", http.StatusNotFound)
		return
	}
	r.URL.Path = strings.TrimRight(p.forge.Path, "/") + r.URL.Path
	r.URL.RawPath = ""
	p.toForge.ServeHTTP(w, r)
}

// authorized checks the proxy credentials: only the runner process holds them.
func (p *proxy) authorized(w http.ResponseWriter, r *http.Request) bool {
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(p.user+":"+p.pass))
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Proxy-Authorization")), []byte(want)) == 1 {
		return true
	}
	w.Header().Set("Proxy-Authenticate", `Basic realm="dynrunner"`)
	http.Error(w, "dynrunner executor: this proxy serves the runner only", http.StatusProxyAuthRequired)
	return false
}

// connect serves CONNECT: to an https forge's host the runner's TLS ends here and its
// requests are routed; to any other host the proxy only tunnels.
func (p *proxy) connect(w http.ResponseWriter, r *http.Request) {
	target := r.Host
	if _, _, err := net.SplitHostPort(target); err != nil {
		http.Error(w, "dynrunner executor: CONNECT wants host:port", http.StatusBadRequest)
		return
	}
	intercept := p.forge != nil && p.forge.Scheme == "https" && strings.EqualFold(target, p.forgeHost)
	var up net.Conn
	if !intercept {
		var err error
		if up, err = p.dialTunnel(r.Context(), target); err != nil {
			p.log.Warn().Err(err).Str("target", target).Msg("runner tunnel refused")
			http.Error(w, "dynrunner executor: "+err.Error(), http.StatusBadGateway)
			return
		}
	}
	rc := http.NewResponseController(w)
	conn, buf, err := rc.Hijack()
	if err != nil {
		if up != nil {
			up.Close()
		}
		return
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		conn.Close()
		if up != nil {
			up.Close()
		}
		return
	}
	client := conn
	if buf.Reader.Buffered() > 0 {
		client = &prefixConn{Conn: conn, r: io.MultiReader(io.LimitReader(buf.Reader, int64(buf.Reader.Buffered())), conn)}
	}
	if intercept {
		p.conns.push(tls.Server(client, p.inner.TLSConfig))
		return
	}
	if !p.track(client, up) {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		splice(client, up)
		p.untrack(client, up)
	}()
}

// dialTunnel opens a connection to target, through the environment's own proxy when its
// settings name one for it.
func (p *proxy) dialTunnel(ctx context.Context, target string) (net.Conn, error) {
	via, err := p.upstream(&http.Request{Method: http.MethodConnect, URL: &url.URL{Scheme: "https", Host: target}, Header: http.Header{}})
	if err != nil {
		return nil, err
	}
	if via == nil {
		return p.dialer.DialContext(ctx, "tcp", target)
	}
	if via.Scheme != "http" {
		return nil, fmt.Errorf("the environment's proxy %s for %s: only http proxies are chained", via.Redacted(), target)
	}
	c, err := p.dialer.DialContext(ctx, "tcp", hostPort(via))
	if err != nil {
		return nil, err
	}
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: target}, Host: target, Header: http.Header{}}
	if u := via.User; u != nil {
		pw, _ := u.Password()
		req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pw)))
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := req.Write(c); err != nil {
		c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		c.Close()
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return nil, fmt.Errorf("the environment's proxy %s answered %s for %s", via.Redacted(), resp.Status, target)
	}
	_ = c.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &prefixConn{Conn: c, r: io.MultiReader(io.LimitReader(br, int64(br.Buffered())), c)}, nil
	}
	return c, nil
}

func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.tunnels[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.tunnels, c)
	}
}

// splice copies both ways until either side ends, then closes both.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
	a.Close()
	b.Close()
}

// prefixConn is a connection whose first bytes were already read into a buffer.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// connListener hands connections (the runner's intercepted TLS) to an http.Server.
type connListener struct {
	addr net.Addr
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// hostPort returns u's host with its port, the scheme's default when u names none.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// isLoopback reports whether u names a loopback host, which Go's proxy support never proxies.
func isLoopback(u *url.URL) bool {
	h := u.Hostname()
	if strings.EqualFold(h, "localhost") || strings.HasSuffix(strings.ToLower(h), ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// selfSigned returns a certificate for host, for the runner's loopback hop to the proxy
// (which the runner does not verify); its key exists only in this process.
func selfSigned(host string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("executor: proxy certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("executor: proxy certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: host},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("executor: proxy certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(errors.New("executor: no randomness: " + err.Error()))
	}
	return hex.EncodeToString(b)
}

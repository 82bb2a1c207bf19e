package servertest

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a server, for tests of what a client
// does when its connection goes down, or when some of what it sends or
// receives is lost. Cut closes every connection and refuses new ones until
// Restore.
type Proxy struct {
	// URL is where clients connect: nats://127.0.0.1:port.
	URL string

	target string
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
	// See Watch.
	toServer   func(chunk []byte) bool
	fromServer func(chunk []byte)
}

// Watch sets what the connections made from now on pass through: toServer,
// if not nil, sees each chunk a client sends, as read, and says whether to
// forward it (a chunk not forwarded is lost); fromServer, if not nil, sees
// each chunk the server sends, once forwarded. Both run on the
// connections' goroutines, and may call Cut.
func (p *Proxy) Watch(toServer func(chunk []byte) bool, fromServer func(chunk []byte)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.toServer, p.fromServer = toServer, fromServer
}

// NewProxy starts a proxy to target (host:port), stopped by t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{URL: "nats://" + ln.Addr().String(), target: target, ln: ln}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, s)
		toServer, fromServer := p.toServer, p.fromServer
		p.wg.Go(func() {
			defer s.Close()
			pipe(s, c, toServer, nil)
		})
		p.wg.Go(func() {
			defer c.Close()
			pipe(c, s, nil, fromServer)
		})
		p.mu.Unlock()
	}
}

// pipe copies from to to, chunk by chunk, through keep and seen.
func pipe(to, from net.Conn, keep func([]byte) bool, seen func([]byte)) {
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && (keep == nil || keep(buf[:n])) {
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
			if seen != nil {
				seen(buf[:n])
			}
		}
		if err != nil {
			return
		}
	}
}

// Cut closes every connection, and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Restore takes connections again after Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

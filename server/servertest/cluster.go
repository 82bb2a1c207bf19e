package servertest

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// StartCluster starts a JetStream cluster of n plain nats-servers on
// loopback, each stored in its own temporary directory, and waits until
// every node routes to every other and the cluster has a meta leader. t.Cleanup shuts down the nodes still running.
//
// A clustered JetStream needs its routes configured before it starts, so
// each node's route port is taken free beforehand; the client ports are
// the kernel's choice.
func StartCluster(t testing.TB, n int) []*natsserver.Server {
	t.Helper()
	routes := make([]*url.URL, n)
	ports := make([]int, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
		routes[i] = &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", ports[i])}
	}
	nodes := make([]*natsserver.Server, n)
	for i := range n {
		s, err := natsserver.NewServer(&natsserver.Options{
			ServerName: fmt.Sprintf("node-%d", i),
			Host:       "127.0.0.1",
			Port:       -1,
			NoSigs:     true,
			NoLog:      true,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			Cluster:    natsserver.ClusterOpts{Name: "jobq-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:     routes,
		})
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		go s.Start()
		t.Cleanup(func() {
			s.Shutdown()
			s.WaitForShutdown()
		})
		nodes[i] = s
	}
	for i, s := range nodes {
		if !s.ReadyForConnections(30 * time.Second) {
			t.Fatalf("node %d not ready", i)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		current := 0
		for _, s := range nodes {
			if s.JetStreamIsCurrent() && s.NumRemotes() == n-1 {
				current++
			}
		}
		if current == n {
			for _, s := range nodes {
				if s.JetStreamIsLeader() {
					return nodes
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster of %d has no meta leader after 30s", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ConnectNode returns a connection to node s of a cluster, closed by
// t.Cleanup. It reconnects, to any node, for as long as the test runs.
func ConnectNode(t testing.TB, s *natsserver.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("connect to %s: %v", s.Name(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

package servertest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StartCluster starts a JetStream cluster of n plain nats-servers on
// loopback, each stored in its own temporary directory, and waits until
// it is ready for JetStream requests through any node: every node routes
// to every other, the meta leader counts n peers, and each node passes a
// request on to it. t.Cleanup shuts down the nodes still running.
//
// A clustered JetStream needs its routes configured before it starts, so
// each node's route port is taken free beforehand; another process may
// take one meanwhile, in which case the cluster is started again on other
// ports.
func StartCluster(t testing.TB, n int) []*natsserver.Server {
	t.Helper()
	var err error
	for range 3 {
		var nodes []*natsserver.Server
		if nodes, err = startCluster(t, n); err == nil {
			return nodes
		}
		for _, s := range nodes {
			s.Shutdown()
			s.WaitForShutdown()
		}
		t.Logf("start a cluster of %d: %v; starting it again", n, err)
	}
	t.Fatalf("start a cluster of %d: %v", n, err)
	return nil
}

func startCluster(t testing.TB, n int) ([]*natsserver.Server, error) {
	routes := make([]*url.URL, n)
	ports := make([]int, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
		routes[i] = &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", ports[i])}
	}
	var nodes []*natsserver.Server
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
			return nodes, fmt.Errorf("node %d: %w", i, err)
		}
		go s.Start()
		t.Cleanup(func() {
			s.Shutdown()
			s.WaitForShutdown()
		})
		nodes = append(nodes, s)
	}
	for i, s := range nodes {
		if !s.ReadyForConnections(15 * time.Second) {
			return nodes, fmt.Errorf("node %d not ready (its route port %d taken?)", i, ports[i])
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for !clusterReady(nodes) {
		if time.Now().After(deadline) {
			return nodes, fmt.Errorf("no meta leader with %d peers, routed to by every node, after 30s", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i, s := range nodes {
		if err := answersThrough(s, deadline); err != nil {
			return nodes, fmt.Errorf("node %d: %w", i, err)
		}
	}
	return nodes, nil
}

// clusterReady reports whether every node routes to every other and is
// current, and the meta leader counts every node a peer.
func clusterReady(nodes []*natsserver.Server) bool {
	leader := false
	for _, s := range nodes {
		if !s.JetStreamIsCurrent() || s.NumRemotes() != len(nodes)-1 {
			return false
		}
		if s.JetStreamIsLeader() {
			leader = len(s.JetStreamClusterPeers()) == len(nodes)
		}
	}
	return leader
}

// answersThrough waits until a JetStream request through s, which only
// the meta leader answers, is answered.
func answersThrough(s *natsserver.Server, deadline time.Time) error {
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no JetStream answer through it: %w", err)
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

package server_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/jobq/jobq/server"
	"github.com/jobq/jobq/server/servertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats-server keeps process-wide goroutines once JetStream started.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreTopFunction("time.Sleep"),
	)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     server.Config
		wantErr string
		is      error
	}{
		{name: "ok loopback", cfg: server.Config{StoreDir: "x", Listen: "127.0.0.1:4222"}},
		{name: "ok in-process", cfg: server.Config{StoreDir: "x"}},
		{name: "ok localhost", cfg: server.Config{StoreDir: "x", Listen: "localhost:0"}},
		{name: "ok ipv6 loopback", cfg: server.Config{StoreDir: "x", Listen: "[::1]:4222"}},
		{name: "empty store", cfg: server.Config{}, wantErr: "store dir is empty"},
		{name: "open without auth", cfg: server.Config{StoreDir: "x", Listen: "0.0.0.0:4222"}, is: server.ErrInsecureListen},
		{name: "all interfaces without auth", cfg: server.Config{StoreDir: "x", Listen: ":4222"}, is: server.ErrInsecureListen},
		{name: "open with token", cfg: server.Config{StoreDir: "x", Listen: "0.0.0.0:4222", Token: "s3cret"}},
		{name: "open insecure", cfg: server.Config{StoreDir: "x", Listen: "0.0.0.0:4222", Insecure: true}},
		{name: "user without password", cfg: server.Config{StoreDir: "x", User: "a"}, wantErr: "go together"},
		{name: "cert without key", cfg: server.Config{StoreDir: "x", TLSCert: "a"}, wantErr: "go together"},
		{name: "bad listen", cfg: server.Config{StoreDir: "x", Listen: "4222"}, wantErr: "want host:port"},
		{name: "bad port", cfg: server.Config{StoreDir: "x", Listen: "127.0.0.1:99999"}, wantErr: "port must be"},
		{name: "http loopback", cfg: server.Config{StoreDir: "x", HTTP: "127.0.0.1:8222"}},
		{name: "http open without auth", cfg: server.Config{StoreDir: "x", HTTP: "0.0.0.0:8222"}, is: server.ErrInsecureListen},
		{name: "http on all interfaces without auth", cfg: server.Config{StoreDir: "x", HTTP: ":8222"}, is: server.ErrInsecureListen},
		{name: "http open with nkey only", cfg: server.Config{StoreDir: "x", HTTP: "0.0.0.0:8222", NKey: "UB7BXKQSFXEX4R6AGA5OLVOIAQVZZ6OEVTROQA5VZ4FHETKJM3Q5GLHA"}, wantErr: "an --nkey does not reach HTTP"},
		{name: "http open with token", cfg: server.Config{StoreDir: "x", HTTP: "0.0.0.0:8222", Token: "s3cret"}},
		{name: "http open with user", cfg: server.Config{StoreDir: "x", HTTP: "0.0.0.0:8222", User: "a", Password: "b"}},
		{name: "http open insecure", cfg: server.Config{StoreDir: "x", HTTP: "0.0.0.0:8222", Insecure: true}},
		{name: "bad http", cfg: server.Config{StoreDir: "x", HTTP: "bogus"}, wantErr: "want host:port"},
		{name: "token and user", cfg: server.Config{StoreDir: "x", Token: "t", User: "u", Password: "p"}, wantErr: "pass one"},
		{name: "bad nkey", cfg: server.Config{StoreDir: "x", NKey: "notakey"}, wantErr: "not a user public key"},
		{name: "negative max store", cfg: server.Config{StoreDir: "x", MaxStore: -1}, wantErr: "want 0"},
		// The server would take these for bcrypt hashes, which jobq's own
		// clients, given only the hash, could not present: serve hung and
		// failed with "read/write on closed pipe".
		{name: "bcrypt password", cfg: server.Config{StoreDir: "x", User: "app", Password: "$2a$11$W2zko751KUvVy59mUTWmpOdWjpEm5qhcCZRd05GjI/sSOT.xtiHyO"}, wantErr: "--password looks like a bcrypt hash"},
		{name: "bcrypt token", cfg: server.Config{StoreDir: "x", Token: "$2y$10$abcdefghijk"}, wantErr: "--token looks like a bcrypt hash"},
		{name: "listen is http", cfg: server.Config{StoreDir: "x", Listen: "127.0.0.1:18230", HTTP: "127.0.0.1:18230"}, wantErr: "are the same address"},
		{name: "listen on all, http on one", cfg: server.Config{StoreDir: "x", Listen: "0.0.0.0:18230", HTTP: "127.0.0.1:18230", Token: "t"}, wantErr: "are the same address"},
		// localhost is a loopback address: serve bound --http first and then
		// failed (exit 1) to listen, blaming "another process".
		{name: "listen on localhost, http on its IP", cfg: server.Config{StoreDir: "x", Listen: "localhost:18230", HTTP: "127.0.0.1:18230"}, wantErr: "are the same address"},
		{name: "listen on an IP, http on localhost", cfg: server.Config{StoreDir: "x", Listen: "127.0.0.1:18230", HTTP: "localhost:18230"}, wantErr: "are the same address"},
		{name: "listen and http on other ports", cfg: server.Config{StoreDir: "x", Listen: "127.0.0.1:18230", HTTP: "127.0.0.1:18231"}},
		{name: "listen and http on random ports", cfg: server.Config{StoreDir: "x", Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.wantErr == "" && tt.is == nil && err != nil:
				t.Errorf("got %v, want no error", err)
			case tt.is != nil && !errors.Is(err, tt.is):
				t.Errorf("got %v, want %v", err, tt.is)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("got %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestSecondServerOnSameStoreIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first := servertest.StartConfig(t, server.Config{StoreDir: dir, Logger: servertest.Logger(t)})
	_, err := server.Start(context.Background(), server.Config{StoreDir: dir, Logger: servertest.Logger(t)})
	if !errors.Is(err, server.ErrStoreLocked) {
		t.Fatalf("second start: got %v, want ErrStoreLocked", err)
	}
	// The first keeps serving.
	nc := servertest.Connect(t, first)
	if _, err := nc.JetStream(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Errorf("first server: %v", err)
	}
}

// StoreFree says, before anything else binds, that another jobq holds the
// store dir, as Start would; a free one, or one not made yet, is free.
func TestStoreFree(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := server.StoreFree(filepath.Join(dir, "not-yet")); err != nil {
		t.Errorf("StoreFree of a dir not made yet: %v, want nil", err)
	}
	srv := servertest.StartConfig(t, server.Config{StoreDir: dir, Logger: servertest.Logger(t)})
	if err := server.StoreFree(dir); !errors.Is(err, server.ErrStoreLocked) || !strings.Contains(err.Error(), "--store-dir") {
		t.Errorf("StoreFree of a held store: %v, want ErrStoreLocked saying what to do", err)
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := server.StoreFree(dir); err != nil {
		t.Errorf("StoreFree once the server stopped: %v, want nil", err)
	}
	// StoreFree took no lock of its own.
	servertest.StartConfig(t, server.Config{StoreDir: dir, Logger: servertest.Logger(t)})
}

// StoreDir is the store dir as given, which a user may copy from the log
// into --store-dir; the server's own jetstream directory in it was logged,
// and a jobq started on it found an empty store.
func TestStoreDirIsTheGivenDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := servertest.StartConfig(t, server.Config{StoreDir: dir, Logger: servertest.Logger(t)})
	want, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.StoreDir(); got != want {
		t.Errorf("StoreDir = %q, want %q", got, want)
	}
}

func TestBadStoreDir(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "a-file")
	os.WriteFile(file, nil, 0o600)
	tests := []struct{ name, dir, want string }{
		{name: "missing parent", dir: filepath.Join(t.TempDir(), "no", "such", "dir"), want: "parent exists"},
		{name: "a file", dir: file, want: "not writable"},
		{name: "under a file", dir: filepath.Join(file, "x"), want: "create store dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := server.Start(context.Background(), server.Config{StoreDir: tt.dir, Logger: servertest.Logger(t)})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestListenTakenFailsFast(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	start := time.Now()
	_, err = server.Start(context.Background(), server.Config{StoreDir: t.TempDir(), Listen: ln.Addr().String(), Logger: servertest.Logger(t)})
	if err == nil {
		t.Fatal("got no error on a taken port")
	}
	if !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), "another --listen") {
		t.Errorf("got %v, want it to say the address is in use and what to do", err)
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("took %s to fail, want the listen error reported, not the ready timeout", time.Since(start))
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	os.WriteFile(seedFile, seed, 0o600)
	nkeyOpt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		cfg   server.Config
		good  nats.Option
		wrong nats.Option
	}{
		{name: "token", cfg: server.Config{Token: "s3cret"}, good: nats.Token("s3cret"), wrong: nats.Token("guess")},
		{name: "user", cfg: server.Config{User: "app", Password: "pw"}, good: nats.UserInfo("app", "pw"), wrong: nats.UserInfo("app", "no")},
		{name: "nkey", cfg: server.Config{NKey: pub}, good: nkeyOpt, wrong: nats.Token("guess")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.Listen, cfg.Logger = "127.0.0.1:0", servertest.Logger(t)
			srv := servertest.StartConfig(t, cfg)
			url := srv.ClientURL()
			if nc, err := nats.Connect(url); err == nil {
				nc.Close()
				t.Errorf("connect without credentials: got a connection, want refusal")
			}
			if nc, err := nats.Connect(url, tt.wrong); err == nil {
				nc.Close()
				t.Errorf("connect with wrong credentials: got a connection, want refusal")
			}
			nc, err := nats.Connect(url, tt.good)
			if err != nil {
				t.Fatalf("connect with credentials: %v", err)
			}
			nc.Close()
			// jobq's own in-process connection works under every auth mode.
			servertest.Connect(t, srv).Flush()
		})
	}
}

func TestTLSRoundTrip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := servertest.SelfSignedCert(t, dir)
	srv := servertest.StartConfig(t, server.Config{
		Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, Token: "t", Logger: servertest.Logger(t),
	})
	url := srv.ClientURL()
	if nc, err := nats.Connect(url, nats.Token("t")); err == nil {
		nc.Close()
		t.Errorf("connect without trusting the certificate: got a connection, want a TLS error")
	}
	nc, err := nats.Connect(url, nats.Token("t"), nats.RootCAs(certFile))
	if err != nil {
		t.Fatalf("connect over TLS: %v", err)
	}
	defer nc.Close()
	sub, _ := nc.SubscribeSync("ping")
	nc.Publish("ping", []byte("pong"))
	if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != "pong" {
		t.Errorf("round trip: got %v, %v; want pong", m, err)
	}
}

// With --nkey the user sets no password, so the server's advice to use
// nkeys or bcrypt instead of plain-text passwords, which jobq's internal
// user drew at every start, is not given.
func TestNKeyStartGivesNoPlaintextPasswordWarning(t *testing.T) {
	t.Parallel()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	var out servertest.LogBuffer
	srv := servertest.StartConfig(t, server.Config{StoreDir: t.TempDir(), Listen: "127.0.0.1:0", NKey: pub, Logger: zerolog.New(&out).Level(zerolog.WarnLevel)})
	servertest.Connect(t, srv).Flush() // jobq's own connection still works
	if strings.Contains(out.String(), "Plaintext passwords") {
		t.Errorf("start with --nkey logged: %s", strings.TrimSpace(out.String()))
	}
}

// A user's seed given to --nkey, which takes its public key, is refused
// without being shown: the message quoted it, and the secret went to the
// terminal or the service's log.
func TestNKeySeedIsNotShown(t *testing.T) {
	t.Parallel()
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	err := server.Config{StoreDir: "x", NKey: string(seed)}.Validate()
	if err == nil || !strings.Contains(err.Error(), "--nkey") || !strings.Contains(err.Error(), "public key") {
		t.Fatalf("--nkey SEED: got %v, want an error asking for the public key", err)
	}
	if strings.Contains(err.Error(), string(seed[8:40])) {
		t.Errorf("--nkey SEED: got %q, which shows the seed", err)
	}
}

package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"
)

// ErrStoreLocked is returned by Start when another process holds StoreDir.
var ErrStoreLocked = errors.New("store dir is in use by another jobq")

// ErrInsecureListen is returned by Config.Validate for a non-loopback Listen
// address without authentication or Insecure.
var ErrInsecureListen = errors.New("listening on a non-loopback address needs authentication")

// Config configures the embedded server. The zero value of each field other
// than StoreDir means its default.
type Config struct {
	// StoreDir is where JetStream keeps its files. Required.
	StoreDir string
	// Listen is the host:port of the NATS client port. Empty means
	// in-process only: no TCP listener. Port 0 picks a free port.
	Listen string
	// Token, or User with Password, is the credential clients must present.
	// NKey is a user public key clients authenticate with instead. Empty
	// means no authentication.
	Token    string
	User     string
	Password string
	NKey     string
	// HTTP is the host:port of jobq's HTTP endpoints, which the server
	// does not serve but checks as it does Listen: a non-loopback one needs
	// a Token, or User with Password (an NKey does not reach HTTP). Empty
	// means none.
	HTTP string
	// Insecure allows a non-loopback Listen or HTTP without authentication.
	Insecure bool
	// TLSCert and TLSKey, both set, turn on TLS for the client port.
	TLSCert string
	TLSKey  string
	// SyncInterval is how often JetStream fsyncs its files. Defaults to 1s.
	// SyncAlways fsyncs every write instead.
	SyncInterval time.Duration
	SyncAlways   bool
	// MaxStore and MaxMemory cap JetStream's file and memory storage in
	// bytes. Default to nats-server's own limits (75% of disk and memory).
	MaxStore  int64
	MaxMemory int64
	// MaxPayload is the largest message the server accepts. Defaults to 1 MiB.
	MaxPayload int32
	// ReadyTimeout bounds the wait for the server to accept connections.
	// Defaults to 30s.
	ReadyTimeout time.Duration
	// Logger receives the server's log lines with component=nats.
	Logger zerolog.Logger
	// Debug passes nats-server's debug lines through.
	Debug bool
	// OnStoreError, if set, is called when the store fails a write (a full
	// or failing disk). nats-server then refuses writes to that stream
	// until it restarts; jobs already stored stay on disk.
	OnStoreError func(msg string)

	internalPassword string // for jobq's own clients beside an nkey user
}

// internalUser is the user jobq's in-process clients use when the client
// port authenticates by nkey.
const internalUser = "jobq-internal"

func (c Config) withDefaults() Config {
	if c.SyncInterval == 0 {
		c.SyncInterval = time.Second
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = 1 << 20
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 30 * time.Second
	}
	return c
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	if c.StoreDir == "" {
		return errors.New("store dir is empty: pass --store-dir")
	}
	if (c.User == "") != (c.Password == "") {
		return errors.New("--user and --password go together: pass both or neither")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together: pass both or neither")
	}
	methods := 0
	for _, set := range []bool{c.Token != "", c.User != "", c.NKey != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		return errors.New("--token, --user with --password, and --nkey are alternatives: pass one")
	}
	for flag, secret := range map[string]string{"--password": c.Password, "--token": c.Token} {
		if bcryptHash.MatchString(secret) {
			// The server would compare what clients present against it
			// hashed, and jobq's own clients have only the hash to present.
			return fmt.Errorf("%s looks like a bcrypt hash: pass the secret itself", flag)
		}
	}
	if c.NKey != "" && strings.HasPrefix(c.NKey, "S") {
		// Every nkey seed starts with S: the secret itself, which no
		// message may show.
		return errors.New("--nkey is given an nkey seed, a secret (not shown): pass the user's public key, as `nk -inkey SEED_FILE -pubout` prints it, and give the seed file to clients' --nkey-seed")
	}
	if c.NKey != "" && !nkeys.IsValidPublicUserKey(c.NKey) {
		return fmt.Errorf("--nkey %q is not a user public key: pass one starting with U, as `nk -gen user -pubout` prints", c.NKey)
	}
	if c.SyncInterval < 0 || c.SyncInterval > 0 && c.SyncInterval < MinSyncInterval {
		return fmt.Errorf("--sync %s: want %s or more, or always", c.SyncInterval, MinSyncInterval)
	}
	if c.MaxStore < 0 || c.MaxMemory < 0 {
		return fmt.Errorf("--max-store %d, --max-memory %d: want 0 (the server's default) or more", c.MaxStore, c.MaxMemory)
	}
	if c.Listen != "" {
		host, _, err := splitListen(c.Listen)
		if err != nil {
			return err
		}
		if !isLoopback(host) && !c.hasAuth() && !c.Insecure {
			return fmt.Errorf("%w: %s is not loopback; pass --token, --user and --password, or --nkey, or --insecure to accept anyone", ErrInsecureListen, c.Listen)
		}
	}
	if c.HTTP != "" {
		host, port, err := net.SplitHostPort(c.HTTP)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
			return fmt.Errorf("--http %q: want host:port with a port of 0-65535, e.g. 127.0.0.1:8222", c.HTTP)
		}
		if host == "" {
			host = "0.0.0.0"
		}
		if !isLoopback(host) && c.Token == "" && c.User == "" && !c.Insecure {
			return fmt.Errorf("%w: --http %s is not loopback; pass --token, or --user and --password (an --nkey does not reach HTTP), or --insecure to accept anyone", ErrInsecureListen, c.HTTP)
		}
		if sameAddress(c.Listen, c.HTTP) {
			return fmt.Errorf("--listen %s and --http %s are the same address: pass two different ones", c.Listen, c.HTTP)
		}
	}
	return nil
}

// bcryptHash matches what the server takes for a bcrypt hash of a secret.
var bcryptHash = regexp.MustCompile(`^\$2[abxy]?\$\d\d\$`)

// sameAddress reports whether listen and http name one port that both
// would listen on: the same fixed port, on the same host or on all of
// them.
func sameAddress(listen, http string) bool {
	if listen == "" {
		return false
	}
	lh, lp, err := splitListen(listen)
	if err != nil || lp <= 0 {
		return false
	}
	hh, hp, err := net.SplitHostPort(http)
	if err != nil || hp != strconv.Itoa(lp) {
		return false
	}
	any := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	// localhost is bound as 127.0.0.1 (Go listens on its IPv4 address).
	named := func(h string) string {
		if strings.EqualFold(h, "localhost") {
			return "127.0.0.1"
		}
		return h
	}
	return named(lh) == named(hh) || any(lh) || any(hh)
}

// MinSyncInterval is the shortest interval between the store's syncs to
// disk: the file store spreads its syncs over a random share of the
// interval, and for anything shorter SyncAlways is what is wanted.
const MinSyncInterval = time.Millisecond

func (c Config) hasAuth() bool { return c.Token != "" || c.User != "" || c.NKey != "" }

// Server is a running embedded NATS server with JetStream.
type Server struct {
	ns      *natsserver.Server
	dir     string // the store dir, absolute
	lock    *os.File
	cfg     Config
	log     zerolog.Logger
	adapter *logAdapter
}

// Start starts the server on cfg.StoreDir and returns once it accepts
// connections. The caller must call Shutdown.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.StoreDir)
	if err != nil {
		return nil, fmt.Errorf("store dir %s: %w", cfg.StoreDir, err)
	}
	// The parent must exist: a typo in --store-dir should not silently grow
	// a new tree somewhere.
	if err := os.Mkdir(dir, 0o750); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create store dir: %w; pass a writable --store-dir whose parent exists", err)
	}
	if err := checkWritable(dir); err != nil {
		return nil, err
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	if cfg.NKey != "" {
		cfg.internalPassword = nuid.Next() + nuid.Next()
	}
	opts, err := cfg.options(dir)
	if err != nil {
		unlockDir(lock)
		return nil, err
	}
	ns, err := natsserver.NewServer(opts)
	if err != nil {
		unlockDir(lock)
		return nil, fmt.Errorf("configure nats server: %w", err)
	}
	log := cfg.Logger.With().Str("component", "nats").Logger()
	adapter := &logAdapter{log: log, storeError: cfg.OnStoreError}
	ns.SetLoggerV2(adapter, cfg.Debug, false, false)

	ns.Start()
	if err := waitReady(ctx, ns, adapter, cfg.ReadyTimeout); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		unlockDir(lock)
		return nil, err
	}
	if !ns.JetStreamEnabled() {
		ns.Shutdown()
		ns.WaitForShutdown()
		unlockDir(lock)
		return nil, fmt.Errorf("jetstream did not start in %s; check the log above and the store dir's permissions", dir)
	}
	return &Server{ns: ns, dir: dir, lock: lock, cfg: cfg, log: log, adapter: adapter}, nil
}

// checkWritable fails early, with a clear message, on a store dir jobq
// cannot write.
func checkWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".jobq-write-check-*")
	if err != nil {
		return fmt.Errorf("store dir %s is not writable: %w; fix its permissions or pass another --store-dir", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

func waitReady(ctx context.Context, ns *natsserver.Server, log *logAdapter, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if ns.ReadyForConnections(100 * time.Millisecond) {
			return nil
		}
		if msg := log.lastFatal(); msg != "" {
			if strings.Contains(msg, "address already in use") {
				return fmt.Errorf("start nats server: %s; another process listens there (a jobq or NATS server?): stop it or pass another --listen", msg)
			}
			return fmt.Errorf("start nats server: %s", msg)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("wait for nats server: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats server not ready after %s; is the listen address free?", limit)
		}
	}
}

func (c Config) options(dir string) (*natsserver.Options, error) {
	opts := &natsserver.Options{
		ServerName:         "jobq",
		JetStream:          true,
		StoreDir:           dir,
		SyncInterval:       c.SyncInterval,
		SyncAlways:         c.SyncAlways,
		JetStreamMaxStore:  c.MaxStore,
		JetStreamMaxMemory: c.MaxMemory,
		MaxPayload:         c.MaxPayload,
		NoSigs:             true,
		// Nearly every subject jobq's traffic routes is new: each record's
		// key, each ack's subject, each publish's reply. The server's
		// shared cache of subject matches would miss on each, taking a
		// write lock for the insert that every connection's reads and
		// every stream's replies wait on, and sweep it when full. Each
		// connection's own cache still serves the subjects that repeat.
		NoSublistCache: true,
		DontListen:     c.Listen == "",
		Authorization:  c.Token,
		Username:       c.User,
		Password:       c.Password,
	}
	if c.NKey != "" {
		// Nkey users sign with a seed the server never sees, so jobq's own
		// in-process clients get a password user of their own alongside.
		opts.Nkeys = []*natsserver.NkeyUser{{Nkey: c.NKey}}
		// The server keeps its hash, as it would a user's: a password in
		// plain text makes it warn at every start to use nkeys or bcrypt,
		// which the user does.
		hash, err := bcrypt.GenerateFromPassword([]byte(c.internalPassword), bcrypt.MinCost)
		if err != nil {
			return nil, fmt.Errorf("hash the internal password: %w", err)
		}
		opts.Users = []*natsserver.User{{Username: internalUser, Password: string(hash)}}
	}
	if c.Listen != "" {
		host, port, err := splitListen(c.Listen)
		if err != nil {
			return nil, err
		}
		opts.Host, opts.Port = host, port
	}
	if c.TLSCert != "" {
		tc, err := natsserver.GenTLSConfig(&natsserver.TLSConfigOpts{CertFile: c.TLSCert, KeyFile: c.TLSKey})
		if err != nil {
			return nil, fmt.Errorf("load --tls-cert and --tls-key: %w", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSTimeout = tc, true, 2
	}
	return opts, nil
}

// splitListen parses host:port; port 0 means any free port.
func splitListen(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("listen address %q: want host:port, e.g. 127.0.0.1:4222", addr)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("listen address %q: port must be 0-65535", addr)
	}
	if port == 0 {
		port = natsserver.RANDOM_PORT
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Connect returns a client connection to the server that does not use the
// network (nats.InProcessServer).
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(s.ns), nats.Name("jobq")}, opts...)
	switch {
	case s.cfg.Token != "":
		opts = append(opts, nats.Token(s.cfg.Token))
	case s.cfg.User != "":
		opts = append(opts, nats.UserInfo(s.cfg.User, s.cfg.Password))
	case s.cfg.NKey != "":
		opts = append(opts, nats.UserInfo(internalUser, s.cfg.internalPassword))
	}
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("connect in-process: %w", err)
	}
	return nc, nil
}

// ClientURL returns the nats:// URL of the client port, or "" without one.
func (s *Server) ClientURL() string {
	if s.cfg.Listen == "" {
		return ""
	}
	return s.ns.ClientURL()
}

// StoreErr returns the store's last failed write, or nil: after one,
// nats-server refuses writes to that stream until it restarts.
func (s *Server) StoreErr() error {
	if p := s.adapter.lastStoreError.Load(); p != nil {
		return errors.New(*p)
	}
	return nil
}

// StoreDir returns the absolute store directory, as given (the server keeps
// its files in a jetstream directory in it).
func (s *Server) StoreDir() string { return s.dir }

// MonitorHandlers returns nats-server's monitoring endpoints by path, to be
// served on jobq's own HTTP address: /varz (server information and
// statistics) and /jsz (JetStream usage; ?streams=1&consumers=1 for
// details). They answer JSON and take nats-server's query parameters.
func (s *Server) MonitorHandlers() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		natsserver.VarzPath: s.ns.HandleVarz,
		natsserver.JszPath:  s.ns.HandleJsz,
	}
}

// Shutdown stops the server, waits until it has stopped and releases the
// store lock. It is safe to call more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.ns == nil {
		return nil
	}
	s.log.Info().Msg("shutting down nats server")
	done := make(chan struct{})
	go func() {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("shut down nats server: %w", ctx.Err())
	}
	unlockDir(s.lock)
	s.ns, s.lock = nil, nil
	return nil
}

// Command jobq is a job system in one executable: an embedded NATS JetStream
// server, a work queue, exactly-once workers and the commands to drive them.
// See README.md.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/mattn/go-isatty"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
	"go.yaml.in/yaml/v3"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/queue/dashboard"
	"github.com/jobq/jobq/server"
)

// Set by make build through -ldflags.
var (
	version = "dev"
	commit  = "none"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() { os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr)) }

// usageError marks bad usage: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func badUsage(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// run runs jobq with args and returns its exit status. It never calls
// os.Exit, so every defer runs.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// A command's output that could not be written (a full disk, a closed
	// pipe) fails it, though it printed with no check of its own.
	out := &errWriter{w: stdout}
	app := newApp(stdin, out, stderr)
	if len(args) > 2 && (args[1] == "help" || args[1] == "h") && findCommand(app.Commands, args[2]) == nil {
		fmt.Fprintf(stderr, "jobq: unknown command %q: see jobq --help\n", args[2])
		return exitUsage
	}
	args, err := configArgs(app, args, os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "jobq: %s\n", oneLine(err.Error()))
		var ue usageError
		if errors.As(err, &ue) {
			return exitUsage
		}
		return exitFailure
	}
	err = app.Run(flagsFirst(app, args))
	if err == nil && out.err != nil {
		err = fmt.Errorf("write output: %w", out.err)
	}
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "jobq: %s\n", oneLine(err.Error()))
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitFailure
}

// configArgs turns the settings of a config file into command-line flags
// for the command args names, placed right after the command, so that flags
// given on the command line, and JOBQ_* variables, override them. The file
// is --config FILE (anywhere in args) or JOBQ_CONFIG; its keys are flag
// names. Keys that are a flag of some other command are skipped; a key no
// command knows is an error.
func configArgs(app *cli.App, args []string, lookupEnv func(string) (string, bool)) ([]string, error) {
	path, rest := "", make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			rest = append(rest, args[i:]...)
			i = len(args)
		case a == "--config" || a == "-config":
			if i+1 >= len(args) {
				return nil, badUsage("--config needs a file, e.g. --config jobq.yaml")
			}
			path = args[i+1]
			i++
		case strings.HasPrefix(a, "--config=") || strings.HasPrefix(a, "-config="):
			_, path, _ = strings.Cut(a, "=")
		default:
			rest = append(rest, a)
		}
	}
	if path == "" {
		path, _ = lookupEnv("JOBQ_CONFIG")
	}
	if path == "" || len(rest) < 2 {
		return rest, nil
	}
	cmd, at := findCommand(app.Commands, rest[1]), 2
	for cmd != nil && at < len(rest) && findCommand(cmd.Subcommands, rest[at]) != nil {
		cmd, at = findCommand(cmd.Subcommands, rest[at]), at+1
	}
	if cmd == nil {
		return rest, nil
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, badUsage("--config %s: no such file", path)
	}
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	// Nodes, not Go values: a value is the text as written (token: 0123
	// is 0123, not the octal 83).
	var settings map[string]yaml.Node
	if err := yaml.Unmarshal(raw, &settings); err != nil {
		return nil, usageError{fmt.Errorf("config %s: %w", path, oneLineErr(err))}
	}
	known := map[string]bool{}
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, c := range cmds {
			for _, f := range c.Flags {
				for _, n := range f.Names() {
					known[n] = true
				}
			}
			walk(c.Subcommands)
		}
	}
	walk(app.Commands)
	mine := map[string]cli.Flag{} // by every name: a key may be a short one (s: for server)
	for _, f := range cmd.Flags {
		for _, n := range f.Names() {
			mine[n] = f
		}
	}
	onCommandLine := func(f cli.Flag) bool { // by any of its names: -s is --server
		for _, a := range rest[at:] {
			if a == "--" {
				return false
			}
			if n, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); strings.HasPrefix(a, "-") && slices.Contains(f.Names(), n) {
				return true
			}
		}
		return false
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var injected []string
	given := map[string]string{} // a flag's name: the key that set it
	for _, k := range keys {
		if !known[k] {
			return nil, badUsage("config %s: unknown setting %q: use flag names, e.g. store-dir", path, k)
		}
		f, ok := mine[k]
		if !ok {
			continue // another command's setting
		}
		name := f.Names()[0]
		if other, twice := given[name]; twice {
			return nil, badUsage("config %s: %s and %s are one setting; keep one", path, other, k)
		}
		given[name] = k
		if envWins(f, lookupEnv) || onCommandLine(f) {
			continue // the environment and the command line win
		}
		values, err := configValues(settings[k])
		if err != nil {
			return nil, badUsage("config %s: %s: %v", path, k, err)
		}
		for _, v := range values {
			if err := flagValueOK(f, v); err != nil {
				return nil, badUsage("config %s: %s: invalid value %q: %v", path, k, v, err)
			}
			if _, isBool := f.(*cli.BoolFlag); isBool {
				injected = append(injected, "--"+k+"="+v)
				continue
			}
			injected = append(injected, "--"+k, v)
		}
	}
	out := append([]string{}, rest[:at]...)
	out = append(out, injected...)
	return append(out, rest[at:]...), nil
}

// flagValueOK checks v as a value of f, as the command line would, so that
// a bad one in a config file is reported with the file's name.
func flagValueOK(f cli.Flag, v string) error {
	set := flag.NewFlagSet("config", flag.ContinueOnError)
	set.SetOutput(io.Discard)
	if err := f.Apply(set); err != nil {
		return nil // checked when the command line is parsed
	}
	if set.Set(f.Names()[0], v) == nil {
		return nil
	}
	switch f.(type) {
	case *cli.IntFlag, *cli.Int64Flag, *cli.UintFlag, *cli.Uint64Flag:
		return errors.New("want a whole number")
	case *cli.DurationFlag:
		return errors.New("want a duration with its unit, such as 30s or 5m")
	case *cli.BoolFlag:
		return errors.New("want true or false")
	case *cli.Float64Flag:
		return errors.New("want a number")
	}
	return errors.New("not a value this setting takes; see --help")
}

// envWins reports whether f's environment variable is set so that the flag
// parser takes it: an empty one it takes for text and true/false flags
// only (for a repeatable one, such as JOBQ_HANDLER, as one empty value),
// and ignores for the rest, where the config file's value stands.
func envWins(f cli.Flag, lookupEnv func(string) (string, bool)) bool {
	v, set := lookupEnv(env(f.Names()[0])[0])
	switch f.(type) {
	case *cli.StringFlag, *cli.StringSliceFlag, *cli.BoolFlag:
		return set
	}
	return set && v != ""
}

// configValues turns a YAML value into flag values, each the text as
// written: a scalar is one (no value, ~ or null, is the empty one), a list
// is one per item (for repeatable flags such as handler).
func configValues(n yaml.Node) ([]string, error) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return configValues(*n.Alias)
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return []string{""}, nil
		}
		return []string{n.Value}, nil
	case yaml.SequenceNode:
		var out []string
		for _, item := range n.Content {
			if item.Kind == yaml.SequenceNode || item.Kind == yaml.MappingNode {
				return nil, errors.New("want a value or a list of values, not a list of lists or maps")
			}
			s, err := configValues(*item)
			if err != nil {
				return nil, err
			}
			out = append(out, s...)
		}
		return out, nil
	}
	return nil, errors.New("want a value or a list of values, not a map")
}

func oneLineErr(err error) error { return errors.New(oneLine(err.Error())) }

// flagsFirst moves a command's flags in front of its arguments, so that
// `jobq job ID --json` works like `jobq job --json ID` (the flag package
// stops at the first argument). Everything after "--" stays as it is.
func flagsFirst(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	cmds, rest := app.Commands, args[1:]
	var cmd *cli.Command
	for len(rest) > 0 {
		next := findCommand(cmds, rest[0])
		if next == nil {
			break
		}
		cmd, cmds = next, next.Subcommands
		out, rest = append(out, rest[0]), rest[1:]
	}
	if cmd == nil {
		return args
	}
	takesValue := map[string]bool{"help": false, "h": false}
	for _, f := range cmd.Flags {
		_, isBool := f.(*cli.BoolFlag)
		for _, n := range f.Names() {
			takesValue[n] = !isBool
		}
	}
	var flags, positional []string
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			positional = append(positional, rest[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			positional = append(positional, a)
			continue
		}
		// An unknown flag (--help, a typo) stays a flag, so the parser
		// shows help or rejects it instead of taking it as an argument.
		flags = append(flags, a)
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if takesValue[name] && !hasValue {
			if i+1 == len(rest) || rest[i+1] == "--" {
				// A value flag typed last, or before the "--" that
				// ends the flags, with no value (an unset $ID): left
				// last, the parser says it needs one. A "--" after it
				// would be taken for its value (--id=-- sets it).
				return append(out, flags...)
			}
			i++
			flags = append(flags, rest[i])
		}
	}
	out = append(out, flags...)
	if len(positional) > 0 {
		out = append(out, "--")
	}
	return append(out, positional...)
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// flagError words a flag parsing error with flags as they are typed:
// "unknown flag --bogus" rather than "flag provided but not defined: -bogus".
func flagError(err error) string {
	dashes := func(name string) string {
		if len(name) > 1 {
			return "--" + name
		}
		return "-" + name
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "unknown flag " + dashes(name)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "flag needs an argument: " + dashes(name)
	}
	// "invalid value … for flag -name: …", and for a boolean flag
	// "invalid boolean value … for -name: …".
	for _, sep := range []string{" for flag -", " for -"} {
		if before, after, ok := strings.Cut(msg, sep); ok {
			name, rest, _ := strings.Cut(after, ":")
			return before + " for " + dashes(name) + ":" + rest
		}
	}
	return msg
}

// commandPath is how the user typed c's command: "jobq dlq list".
func commandPath(c *cli.Context) string {
	var names []string
	for _, ctx := range c.Lineage() {
		if ctx.Command == nil || ctx.Command.Name == "" || ctx.Command.Name == c.App.Name {
			continue
		}
		if len(names) == 0 || names[0] != ctx.Command.Name {
			names = append([]string{ctx.Command.Name}, names...)
		}
	}
	return strings.Join(append([]string{c.App.Name}, names...), " ")
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *cli.App {
	onUsage := func(c *cli.Context, err error, _ bool) error {
		return usageError{fmt.Errorf("%s; see %s --help", flagError(err), commandPath(c))}
	}
	app := &cli.App{
		Name:                 "jobq",
		Usage:                "a durable job queue with exactly-once workers, in one binary",
		Version:              version,
		Reader:               stdin,
		Writer:               stdout,
		ErrWriter:            stderr,
		EnableBashCompletion: true,
		HideVersion:          true,
		// A --handler command or URL, or a -H value, may hold commas: one
		// flag is one value.
		DisableSliceFlagSeparator: true,
		ExitErrHandler:            func(*cli.Context, error) {}, // run decides the exit status
		OnUsageError:              onUsage,
		Commands: []*cli.Command{
			serveCommand(),
			enqueueCommand(),
			importCommand(),
			nextCommand(),
			statusCommand(),
			jobCommand(),
			dlqCommand(),
			benchCommand(),
			versionCommand(),
			completionCommand(),
		},
		CommandNotFound: func(c *cli.Context, name string) {
			fmt.Fprintf(c.App.ErrWriter, "jobq: unknown command %q: see jobq --help\n", name)
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return badUsage("unknown command %q: see jobq --help", c.Args().First())
			}
			return cli.ShowAppHelp(c)
		},
	}
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, cmd := range cmds {
			cmd.OnUsageError = onUsage
			if len(cmd.Subcommands) == 0 && cmd.ArgsUsage != "" {
				// Its argument may be "help" or "h" (a job ID, a file):
				// no help subcommand takes it (--help still shows help).
				cmd.HideHelpCommand = true
			}
			for _, f := range cmd.Flags {
				withEnv(f)
			}
			walk(cmd.Subcommands)
		}
	}
	walk(app.Commands)
	return app
}

// withEnv gives f its JOBQ_<FLAG> variable (see env): every flag reads
// one, and no flag names its own.
func withEnv(f cli.Flag) {
	var vars *[]string
	switch f := f.(type) {
	case *cli.StringFlag:
		vars = &f.EnvVars
	case *cli.BoolFlag:
		vars = &f.EnvVars
	case *cli.IntFlag:
		vars = &f.EnvVars
	case *cli.Int64Flag:
		vars = &f.EnvVars
	case *cli.DurationFlag:
		vars = &f.EnvVars
	case *cli.StringSliceFlag:
		vars = &f.EnvVars
	default:
		panic(fmt.Sprintf("withEnv: flag %v of type %T", f.Names(), f))
	}
	*vars = env(f.Names()[0])
}

// env returns the environment variable of flag name: JOBQ_ and the name in
// upper snake case.
func env(name string) []string {
	return []string{"JOBQ_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
}

func logFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "log level: trace, debug, info, warn or error"},
		&cli.StringFlag{Name: "log-format", Value: "auto", Usage: "log format: auto (console on a terminal, else json), console or json"},
		&cli.StringFlag{Name: "config", Usage: "YAML file of settings keyed by flag name (e.g. workers: 8); flags and JOBQ_* variables override it"},
	}
}

// newLogger builds the root logger from the global log flags.
func newLogger(c *cli.Context) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(c.String("log-level"))
	if err != nil || c.String("log-level") == "" {
		return zerolog.Nop(), badUsage("--log-level %q: want trace, debug, info, warn or error", c.String("log-level"))
	}
	w := c.App.ErrWriter
	console := false
	switch c.String("log-format") {
	case "console":
		console = true
	case "json":
	case "auto":
		console = terminal(w)
	default:
		return zerolog.Nop(), badUsage("--log-format %q: want auto, console or json", c.String("log-format"))
	}
	if console {
		_, noColor := os.LookupEnv("NO_COLOR")
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: noColor}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// ---- serve ------------------------------------------------------------

func queueFlags() []cli.Flag {
	return []cli.Flag{
		&cli.DurationFlag{Name: "dedupe-window", Value: queue.DefaultDedupeWindow, Usage: "how long JOB drops a job republished with the same ID"},
		&cli.IntFlag{Name: "max-deliver", Value: queue.DefaultMaxDeliver, Usage: "deliveries of a job before it is dead-lettered"},
		&cli.DurationFlag{Name: "ack-wait", Value: queue.DefaultAckWait, Usage: "how long a job may go without ack or heartbeat before redelivery"},
		&cli.DurationFlag{Name: "processed-ttl", Value: queue.DefaultProcessedTTL, Usage: "how long a ledger record lives after its last write"},
		&cli.IntFlag{Name: "workers", Value: queue.DefaultWorkers, Usage: "jobs run at once"},
		&cli.IntFlag{Name: "prefetch", Value: queue.DefaultPrefetch, Usage: "jobs held beyond --workers while their ledger records are read and written (within --prefetch-bytes)"},
		&cli.Int64Flag{Name: "prefetch-bytes", Value: queue.DefaultPrefetchBytes, Usage: "payload bytes the worker pool holds at most, running and waiting; a larger job runs alone"},
		&cli.BoolFlag{Name: "no-ledger", Usage: "turn the ledger off: at-least-once processing, faster (see README)"},
		&cli.StringFlag{Name: "retry-backoff", Value: "1s,10s,1m", Usage: "delays before each retry, comma-separated; the last repeats"},
		&cli.DurationFlag{Name: "job-timeout", Usage: "limit on one attempt (0: none)"},
		&cli.IntFlag{Name: "max-payload", Value: queue.DefaultMaxPayload, Usage: "largest payload accepted, in bytes"},
	}
}

func serveCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "store-dir", Value: "./jobq-data", Usage: "where the embedded server stores jobs and the ledger"},
		&cli.StringFlag{Name: "listen", Value: "127.0.0.1:4222", Usage: "NATS client address of the embedded server (empty: in-process only)"},
		&cli.StringFlag{Name: "http", Value: "127.0.0.1:8222", Usage: "address of the dashboard, /healthz, /readyz, /metrics, /varz and /jsz (empty: off)"},
		&cli.StringSliceFlag{Name: "handler", Usage: "route SUBJECT=SPEC, SPEC is log, exec:COMMAND or http:URL (repeatable)"},
		&cli.BoolFlag{Name: "demo", Usage: "publish a sample payroll job every --demo-interval and log it"},
		&cli.DurationFlag{Name: "demo-interval", Value: 2 * time.Second, Usage: "how often --demo publishes"},
		&cli.StringFlag{Name: "server", Usage: "use this NATS server instead of the embedded one"},
		&cli.IntFlag{Name: "replicas", Value: 1, Usage: "with --server: copies a cluster keeps of JOB, DLQ and processed, for the objects jobq creates (1 to 5)"},
		// Ignored without --server, so that a --config file or JOBQ_*
		// variables shared with the client commands leave the embedded
		// server as it is.
		&cli.StringFlag{Name: "tls-ca", Usage: "with --server: CA certificate file to verify that server's TLS certificate (ignored otherwise)"},
		&cli.StringFlag{Name: "nkey-seed", Usage: "with --server: file holding an nkey seed to authenticate with (ignored otherwise)"},
		&cli.DurationFlag{Name: "shutdown-timeout", Value: 30 * time.Second, Usage: "how long running jobs may finish after SIGINT/SIGTERM"},
		&cli.StringFlag{Name: "token", Usage: "client token the server requires"},
		&cli.StringFlag{Name: "user", Usage: "client user the server requires (with --password)"},
		&cli.StringFlag{Name: "password", Usage: "client password the server requires (with --user)"},
		&cli.StringFlag{Name: "nkey", Usage: "client nkey public key the server accepts"},
		&cli.BoolFlag{Name: "insecure", Usage: "allow a non-loopback --listen or --http without authentication"},
		&cli.StringFlag{Name: "tls-cert", Usage: "TLS certificate file for the client port"},
		&cli.StringFlag{Name: "tls-key", Usage: "TLS key file for the client port"},
		&cli.StringFlag{Name: "sync", Value: "1s", Usage: "how often the store is fsynced: an interval, or always"},
		&cli.Int64Flag{Name: "max-store", Usage: "cap on stored bytes; JOB gets 3/4 of it, DLQ 1/8 (0: the server's default, 75% of the disk)"},
		&cli.Int64Flag{Name: "max-memory", Usage: "cap on memory storage bytes (0: the server's default)"},
	}
	return &cli.Command{
		Name:   "serve",
		Usage:  "run the embedded server, provision JOB, WORKER and processed, and run workers",
		Flags:  append(append(flags, queueFlags()...), logFlags()...),
		Action: serve,
	}
}

// config turns the command line into the package configs.
func config(c *cli.Context, log zerolog.Logger) (server.Config, queue.Config, error) {
	backoff, err := parseDurations(c.String("retry-backoff"))
	if err != nil {
		return server.Config{}, queue.Config{}, usageError{err}
	}
	qc := queue.Config{
		DedupeWindow:  c.Duration("dedupe-window"),
		MaxDeliver:    c.Int("max-deliver"),
		AckWait:       c.Duration("ack-wait"),
		ProcessedTTL:  c.Duration("processed-ttl"),
		Workers:       c.Int("workers"),
		Prefetch:      c.Int("prefetch"),
		PrefetchBytes: c.Int64("prefetch-bytes"),
		NoLedger:      c.Bool("no-ledger"),
		RetryBackoff:  backoff,
		JobTimeout:    c.Duration("job-timeout"),
		MaxPayload:    c.Int("max-payload"),
		Replicas:      c.Int("replicas"),
	}
	if c.IsSet("max-deliver") && qc.MaxDeliver <= 0 {
		return server.Config{}, queue.Config{}, badUsage("--max-deliver %d: want 1 or more", qc.MaxDeliver)
	}
	if c.IsSet("workers") && (qc.Workers <= 0 || qc.Workers > queue.MaxWorkers) {
		return server.Config{}, queue.Config{}, badUsage("--workers %d: want 1 to %d", qc.Workers, queue.MaxWorkers)
	}
	if qc.Prefetch < 0 || qc.Prefetch > queue.MaxPrefetch {
		return server.Config{}, queue.Config{}, badUsage("--prefetch %d: want 0 to %d", qc.Prefetch, queue.MaxPrefetch)
	}
	if c.IsSet("prefetch-bytes") && qc.PrefetchBytes <= 0 {
		return server.Config{}, queue.Config{}, badUsage("--prefetch-bytes %d: want 1 or more", qc.PrefetchBytes)
	}
	switch r := qc.Replicas; {
	case r < 1 || r > queue.MaxReplicas:
		return server.Config{}, queue.Config{}, badUsage("--replicas %d: want 1 to %d", r, queue.MaxReplicas)
	case r > 1 && c.String("server") == "":
		return server.Config{}, queue.Config{}, badUsage("--replicas %d needs --server and a cluster: the embedded server is one node and keeps one copy", r)
	}
	// An explicit 0 is no "not set": it is under both minimums (1s), and
	// was silently replaced by the default.
	if c.IsSet("ack-wait") && qc.AckWait <= 0 {
		return server.Config{}, queue.Config{}, badUsage("--ack-wait %s: want 1s or more", qc.AckWait)
	}
	if c.IsSet("processed-ttl") && qc.ProcessedTTL <= 0 {
		return server.Config{}, queue.Config{}, badUsage("--processed-ttl %s: want 1s or more, and not shorter than --dedupe-window", qc.ProcessedTTL)
	}
	if c.IsSet("dedupe-window") && qc.DedupeWindow <= 0 {
		return server.Config{}, queue.Config{}, badUsage("--dedupe-window %s: want a positive duration", qc.DedupeWindow)
	}
	if d := c.Duration("demo-interval"); c.Bool("demo") && d <= 0 {
		return server.Config{}, queue.Config{}, badUsage("--demo-interval %s: want a positive duration", d)
	}
	if d := c.Duration("shutdown-timeout"); d < 0 {
		return server.Config{}, queue.Config{}, badUsage("--shutdown-timeout %s: want 0 (cut jobs off at once) or more", d)
	}
	if err := checkMaxPayload(c); err != nil {
		return server.Config{}, queue.Config{}, err
	}
	if ms := c.Int64("max-store"); ms > 0 {
		qc.MaxBytes, qc.DeadMaxBytes = queue.StoreShares(ms)
	}
	if err := qc.Validate(); err != nil {
		return server.Config{}, queue.Config{}, usageError{err}
	}
	listen := c.String("listen")
	if c.String("server") != "" {
		listen = "" // no embedded server listens
	}
	sc := server.Config{
		StoreDir:   c.String("store-dir"),
		Listen:     listen,
		Token:      c.String("token"),
		User:       c.String("user"),
		Password:   c.String("password"),
		NKey:       c.String("nkey"),
		HTTP:       c.String("http"),
		Insecure:   c.Bool("insecure"),
		TLSCert:    c.String("tls-cert"),
		TLSKey:     c.String("tls-key"),
		MaxStore:   c.Int64("max-store"),
		MaxMemory:  c.Int64("max-memory"),
		MaxPayload: int32(min(qc.MaxPayload+64<<10, 64<<20)),
		Logger:     log,
		Debug:      log.GetLevel() <= zerolog.DebugLevel,
	}
	if err := syncFlag(c, &sc); err != nil {
		return server.Config{}, queue.Config{}, err
	}
	if err := sc.Validate(); err != nil {
		return server.Config{}, queue.Config{}, usageError{err}
	}
	for _, f := range []string{"tls-cert", "tls-key"} {
		if name := c.String(f); name != "" {
			if _, err := os.Stat(name); err != nil {
				if strings.Contains(name, "PRIVATE KEY") {
					// The key itself, as PEM, not its file: the secret
					// would be in the message.
					return server.Config{}, queue.Config{}, badUsage("--%s is given a private key, a secret (not shown): pass the name of a file holding it", f)
				}
				return server.Config{}, queue.Config{}, badUsage("--%s: %v", f, err)
			}
		}
	}
	if cert, key := c.String("tls-cert"), c.String("tls-key"); cert != "" && key != "" {
		// Files that are there but hold no certificate and its key are
		// bad usage too, refused before anything starts. The error names
		// no key material.
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			return server.Config{}, queue.Config{}, badUsage("--tls-cert and --tls-key: %v; pass a PEM certificate and the private key it was made for", err)
		}
	}
	return sc, qc, nil
}

// syncFlag reads --sync into sc: always, or how often the store syncs to
// disk, at least server.MinSyncInterval.
func syncFlag(c *cli.Context, sc *server.Config) error {
	s := c.String("sync")
	if s == "always" {
		sc.SyncAlways = true
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < server.MinSyncInterval {
		return badUsage("--sync %q: want a duration of %s or more, such as 1s, or always", s, server.MinSyncInterval)
	}
	sc.SyncInterval = d
	return nil
}

// maxPayloadLimit is the largest --max-payload: nats-server's file store
// keeps no record over 32 MiB, and a job's dead letter adds headers.
const maxPayloadLimit = 32<<20 - 128<<10

// maxImportWindow bounds import's --window, the publishes awaiting acks.
const maxImportWindow = 1 << 16

// checkMaxPayload checks --max-payload.
func checkMaxPayload(c *cli.Context) error {
	if n := c.Int("max-payload"); n < 1 || n > maxPayloadLimit {
		return badUsage("--max-payload %d: want 1 to %d (32 MiB less room for headers: the store keeps no larger record)", n, maxPayloadLimit)
	}
	return nil
}

// parseDurations parses a comma-separated list such as "1s,10s,1m".
func parseDurations(s string) ([]time.Duration, error) {
	var out []time.Duration
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		d, err := time.ParseDuration(part)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("--retry-backoff %q: want durations separated by commas, e.g. 1s,10s,1m", s)
		}
		out = append(out, d)
	}
	return out, nil
}

// routes builds the router from --handler and --demo.
func routes(c *cli.Context, log zerolog.Logger) (*handlers.Router, error) {
	r := handlers.NewRouter()
	for _, route := range c.StringSlice("handler") {
		pattern, spec, err := handlers.ParseRoute(route)
		if err != nil {
			return nil, usageError{fmt.Errorf("--handler %q: %w", handlers.RedactRoute(route), err)}
		}
		h, err := handlers.ParseSpec(spec, log.With().Str("component", "handler").Logger())
		if err != nil {
			return nil, usageError{fmt.Errorf("--handler %q: %w", handlers.RedactRoute(route), err)}
		}
		if err := r.Handle(pattern, h); err != nil {
			return nil, usageError{fmt.Errorf("--handler %q: %w", handlers.RedactRoute(route), err)}
		}
	}
	if c.Bool("demo") {
		// The demo logs every job no --handler routes, including the ones
		// you enqueue yourself; a route of ">" would take jobs from routes
		// such as "*.email", which are less specific.
		r.SetFallback(handlers.Log(log.With().Str("component", "handler").Logger()))
	}
	return r, nil
}

// startEmbedded starts the embedded server on sc. After --max-store was
// lowered, the caps the streams hold from before add up to more than it,
// and the server refuses every stream edit, even one that lowers a cap,
// and cannot lower its own limit while it runs: so the caps are lowered
// first, on the server started once under a limit they fit. jobq serve
// did not start there (insufficient storage resources).
func startEmbedded(ctx context.Context, sc server.Config, qc queue.Config, log zerolog.Logger) (*server.Server, error) {
	srv, err := server.Start(ctx, sc)
	if err != nil || sc.MaxStore <= 0 {
		return srv, err
	}
	stop := func(s *server.Server) {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s.Shutdown(sctx)
	}
	reserved, err := reservedStore(ctx, srv)
	if err != nil {
		stop(srv)
		return nil, err
	}
	if reserved <= uint64(sc.MaxStore) {
		return srv, nil
	}
	log.Info().Uint64("caps", reserved).Int64("max_store", sc.MaxStore).Msg("the streams' caps add up to more than --max-store: lowering them first")
	stop(srv)
	room := sc
	room.MaxStore, room.Listen = 1<<60, ""
	if srv, err = server.Start(ctx, room); err != nil {
		return nil, err
	}
	nc, err := srv.Connect()
	if err == nil {
		var js jetstream.JetStream
		if js, err = jetstream.New(nc); err == nil {
			_, err = queue.Provision(ctx, js, qc, log)
		}
		nc.Close()
	}
	stop(srv)
	if err != nil {
		return nil, fmt.Errorf("lower the streams' caps to --max-store %d: %w", sc.MaxStore, err)
	}
	return server.Start(ctx, sc)
}

// reservedStore is what the caps of srv's streams add up to.
func reservedStore(ctx context.Context, srv *server.Server) (uint64, error) {
	nc, err := srv.Connect()
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	info, err := js.AccountInfo(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the store's use: %w", err)
	}
	return info.ReservedStore, nil
}

func serve(c *cli.Context) (err error) {
	// A stop signal from here on ends serve gracefully, during start-up too.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	if c.NArg() > 0 {
		return badUsage("serve takes no arguments, got %q", c.Args().First())
	}
	sc, qc, err := config(c, log)
	if err != nil {
		return err
	}
	// A failed store write (a full disk) leaves the stream refusing writes
	// until the server restarts: stop, so a supervisor's restart recovers.
	storeFailed := make(chan string, 1)
	sc.OnStoreError = func(msg string) {
		select {
		case storeFailed <- msg:
		default:
		}
	}
	router, err := routes(c, log)
	if err != nil {
		return err
	}
	// --http listens first: a serve that cannot start takes no job. Its
	// probes are answered from here on (see serveHTTP).
	var httpLn net.Listener
	var setHTTP func(http.Handler)
	if addr := c.String("http"); addr != "" {
		if c.String("server") == "" {
			// A second jobq on this store says so, not that --http, the
			// same as the first one's, is taken.
			if err := server.StoreFree(sc.StoreDir); err != nil {
				return err
			}
		}
		if httpLn, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("listen on --http %s: %w; pass a free address of this machine, or --http '' for none", addr, err)
		}
		var hs *http.Server
		hs, setHTTP = serveHTTP(httpLn, log)
		defer func() {
			hctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			hs.Shutdown(hctx)
		}()
	}
	// A stop signal during start-up ends it, as one later would: not a
	// failure.
	interrupted := func(err error) error {
		if ctx.Err() != nil {
			log.Info().Err(err).Msg("stopped during start-up")
			return nil
		}
		return err
	}

	var nc *nats.Conn
	var dial func() (*nats.Conn, error)     // another connection, for the workers
	var monitor map[string]http.HandlerFunc // the embedded server's /varz, /jsz
	var storeErr func() error               // the embedded store's failed write
	if url := c.String("server"); url != "" {
		dial = func() (*nats.Conn, error) { return connect(c, url) }
		if nc, err = dial(); err != nil {
			return interrupted(err)
		}
		log.Info().Str("server", redactURL(url)).Msg("using external nats server")
		if unused := setFlags(c, "store-dir", "listen", "sync", "max-memory", "tls-cert", "tls-key", "nkey", "insecure"); len(unused) > 0 {
			log.Warn().Strs("flags", unused).Msg("these settings are for the embedded server, which --server leaves out: they do nothing")
		}
	} else {
		if unused := setFlags(c, "tls-cert", "tls-key", "nkey"); sc.Listen == "" && len(unused) > 0 {
			log.Warn().Strs("flags", unused).Msg("these settings are for the client port, which --listen '' leaves closed: they do nothing")
		}
		// err is serve's own: the deferred Shutdown below reports its
		// failure through it (with := it set a shadow, and serve exited 0).
		var srv *server.Server
		srv, err = startEmbedded(ctx, sc, qc, log)
		if err != nil {
			return interrupted(err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if serr := srv.Shutdown(sctx); serr != nil && err == nil {
				err = serr
			}
			log.Info().Msg("nats server stopped")
		}()
		dial = func() (*nats.Conn, error) { return srv.Connect() }
		if nc, err = dial(); err != nil {
			return err
		}
		log.Info().Str("store_dir", srv.StoreDir()).Str("listen", srv.ClientURL()).Msg("embedded nats server ready")
		monitor = srv.MonitorHandlers()
		storeErr = srv.StoreErr
	}
	defer closeConn(nc, "main", log)

	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("open jetstream: %w", err)
	}
	reg, metrics := newMetrics()
	qc.Metrics = metrics
	recorder := dashboard.NewRecorder() // what the dashboard shows of the workers
	if c.String("http") != "" {
		qc.Observer = recorder
	}
	obj, err := queue.Provision(ctx, js, qc, log)
	if err != nil {
		return interrupted(err)
	}
	qc = obj.Config
	reg.MustRegister(queue.NewStatusCollector(obj, 0))

	var pool *queue.Pool
	if router.Len() > 0 || c.Bool("demo") { // the demo logs every job
		// The workers get a connection of their own, so that their fetches,
		// ledger writes and acks do not queue behind published jobs.
		wnc, err := dial()
		if err != nil {
			return err
		}
		defer closeConn(wnc, "workers", log)
		wjs, err := jetstream.New(wnc)
		if err != nil {
			return fmt.Errorf("open jetstream: %w", err)
		}
		wobj, err := obj.Bind(ctx, wjs)
		if err != nil {
			return interrupted(err)
		}
		pool = queue.NewPool(wobj, router, log)
		if err := pool.Start(context.WithoutCancel(ctx)); err != nil {
			return interrupted(err)
		}
		log.Info().Strs("handlers", router.Patterns()).Bool("demo_logs_the_rest", c.Bool("demo")).Msg("handlers registered")
	} else {
		log.Info().Msg("no --handler given: serving as a broker; external workers fetch from WORKER")
	}

	if httpLn != nil {
		auth := dashboard.Auth{Token: c.String("token"), User: c.String("user"), Password: c.String("password")}
		dash := dashboard.New(dashboard.Config{Objects: obj, Pool: pool, Recorder: recorder, Auth: auth, Log: log.With().Str("component", "dashboard").Logger()})
		setHTTP(httpHandler(httpLn, obj, pool, storeErr, reg, monitor, dash, auth, log))
	}

	demoDone := make(chan struct{})
	demoCtx, demoCancel := context.WithCancel(ctx)
	defer demoCancel()
	if c.Bool("demo") {
		producer := queue.NewProducer(js, qc)
		go func() {
			defer close(demoDone)
			queue.Demo(demoCtx, producer, c.Duration("demo-interval"), func(err error) {
				log.Error().Err(err).Msg("demo enqueue")
			})
		}()
		log.Info().Dur("interval", c.Duration("demo-interval")).Msg("demo producer started: a payroll job per tick")
	} else {
		close(demoDone)
	}

	log.Info().Str("version", version).Msg("jobq ready")
	var failure error
	select {
	case <-ctx.Done():
	case msg := <-storeFailed:
		failure = fmt.Errorf("store write failed (%s); jobs stored before are kept: free disk space or raise it, then start jobq again", msg)
		log.Error().Str("error", msg).Msg("store write failed: shutting down so a restart recovers")
	}
	stop() // a second signal now kills the process
	log.Info().Msg("shutting down: stop fetching and publishing")
	demoCancel()
	<-demoDone
	if pool != nil {
		sctx, cancel := context.WithTimeout(context.Background(), c.Duration("shutdown-timeout"))
		defer cancel()
		if err := pool.Stop(sctx); err != nil {
			log.Error().Err(err).Msg("stop workers")
		}
	}
	return failure
}

// setFlags lists those of the flags names that are set (on the command
// line, by a JOBQ_ variable or a --config file), for a warning that they
// do nothing: those only the embedded server reads, such as --store-dir,
// with --server; those only the client port reads, such as --tls-cert,
// with an empty --listen. They are not refused, as one environment (the systemd
// unit's JOBQ_STORE_DIR) may serve both.
func setFlags(c *cli.Context, names ...string) []string {
	var set []string
	for _, name := range names {
		if c.IsSet(name) {
			set = append(set, "--"+name)
		}
	}
	return set
}

// closeConn drains nc and waits until it is closed; name says which
// connection it is in the log.
func closeConn(nc *nats.Conn, name string, log zerolog.Logger) {
	log = log.With().Str("conn", name).Logger()
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		nc.Close()
		return
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		log.Warn().Msg("connection drain timed out")
		nc.Close()
	}
	log.Info().Msg("connection closed")
}

// newMetrics returns a registry with the Go and process collectors and
// jobq's counters, and those counters for queue.Config.Metrics.
func newMetrics() (*prometheus.Registry, *queue.Metrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg, queue.NewMetrics(reg)
}

// writeJSON answers v as JSON with code.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// serveHTTP serves ln until the returned server is shut down, at first as
// a process that is starting: /healthz answers 200, /readyz and the rest
// 503 ("starting"), so that a probe gets its answer while a large store is
// recovered or a slow --server answers, rather than wait. set puts the
// full handler in place once jobq is up.
func serveHTTP(ln net.Listener, log zerolog.Logger) (hs *http.Server, set func(http.Handler)) {
	var current atomic.Pointer[http.Handler]
	starting := http.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
			return
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "error": "starting"})
	}))
	current.Store(&starting)
	// Addr tells callers the address, also of a port 0 listener.
	hs = &http.Server{
		Addr: ln.Addr().String(),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			(*current.Load()).ServeHTTP(w, r)
		}),
		// The dashboard's retry-all may take up to 2m (dashboard's retryTimeout).
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 3 * time.Minute, IdleTimeout: 2 * time.Minute,
	}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("http server")
		}
	}()
	return hs, func(h http.Handler) {
		current.Store(&h)
		log.Info().Str("http", ln.Addr().String()).Str("dashboard", "http://"+ln.Addr().String()+"/").Msg("health endpoints ready")
		if !onLoopback(ln) {
			// jobq serves HTTP without TLS: the credentials, and the
			// dashboard's pages and re-drives, cross the network as they
			// are.
			log.Warn().Str("http", ln.Addr().String()).Msg("the HTTP port has no TLS: its credentials and pages go in clear over the network; keep --http on loopback, or put a TLS proxy in front of it")
		}
	}
}

// notReady is what /readyz says of what, which answered err: nil if it
// answered. One that is gone, and that only a restart creates again
// (restart), says so.
func notReady(what string, err error, restart bool) error {
	switch {
	case err == nil:
		return nil
	case restart && (errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrBucketNotFound)):
		return fmt.Errorf("%s is gone: restart jobq serve, which creates it again (%w)", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// httpHandler serves /healthz, /readyz, /metrics from reg, the monitor
// handlers (nats-server's /varz and /jsz; nil with an external server) and
// the dashboard (nil: none) for ln. All but /healthz and /readyz require
// auth when it is enabled.
func httpHandler(ln net.Listener, obj *queue.Objects, pool *queue.Pool, storeErr func() error, reg prometheus.Gatherer, monitor map[string]http.HandlerFunc, dash *dashboard.Dashboard, auth dashboard.Auth, log zerolog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		workers := pool == nil || pool.Running()
		// Each object is checked with or without workers here: external
		// ones (jobq next, nats consumer next JOB WORKER) need them too.
		_, err := obj.Jobs.Info(ctx)
		err = notReady("stream "+queue.StreamJob, err, true)
		if err == nil {
			// The workers fetch through WORKER: without it, every pull
			// fails. A pool creates it again; nothing else does.
			_, cerr := obj.Worker.Info(ctx)
			err = notReady("consumer "+queue.ConsumerWorker, cerr, pool == nil)
		}
		if err == nil && !obj.Config.NoLedger {
			// Without the ledger no job is checked, claimed or recorded.
			_, lerr := obj.Ledger.Status(ctx)
			err = notReady("ledger bucket "+queue.BucketProcessed, lerr, true)
		}
		if err == nil {
			// Without DLQ a job whose deliveries ran out stays in JOB.
			_, derr := obj.Dead.Info(ctx)
			err = notReady("stream "+queue.StreamDLQ, derr, pool == nil)
		}
		if err == nil && storeErr != nil {
			err = storeErr()
		}
		if !workers || err != nil {
			msg := "workers stopped"
			if err != nil {
				msg = err.Error()
			}
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "error": msg})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", auth.Require(promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, // a slow JetStream read leaves the other metrics
		ErrorLog:      promLogger{log},
		Timeout:       10 * time.Second,
	})))
	for path, h := range monitor {
		mux.Handle("GET "+path, auth.Require(sameOriginOnly(h)))
	}
	if dash != nil {
		dash.Register(mux) // it asks for auth itself
	}
	if onLoopback(ln) && auth.Token == "" && auth.User == "" {
		return loopbackHostOnly(mux)
	}
	return mux
}

// onLoopback reports whether ln listens on a loopback address.
func onLoopback(ln net.Listener) bool {
	host, _, err := net.SplitHostPort(ln.Addr().String())
	return err == nil && net.ParseIP(host).IsLoopback()
}

// loopbackHostOnly refuses requests to a loopback listener without
// credentials that name another host: a page whose name a DNS rebinding
// pointed at 127.0.0.1 would otherwise be same-origin with itself, read the
// dashboard and send its POSTs, past the cross-site checks. With
// credentials the rebound page has none, so a reverse proxy may pass its
// own Host on. Probes of /healthz and /readyz are answered whatever the
// name.
func loopbackHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(r.Host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.ToLower(host), ".")
		ip := net.ParseIP(strings.Trim(host, "[]"))
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) && r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
			http.Error(w, "jobq serves this address under localhost or a loopback IP only", http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sameOriginOnly drops the Access-Control-Allow-Origin: * that
// nats-server's monitoring handlers send, which would let any web page
// read /varz and /jsz.
func sameOriginOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(noCORS{w}, r)
	})
}

type noCORS struct{ http.ResponseWriter }

func (w noCORS) WriteHeader(code int) {
	w.Header().Del("Access-Control-Allow-Origin")
	w.ResponseWriter.WriteHeader(code)
}

func (w noCORS) Write(b []byte) (int, error) {
	w.Header().Del("Access-Control-Allow-Origin")
	return w.ResponseWriter.Write(b)
}

// promLogger logs the errors of a /metrics scrape.
type promLogger struct{ log zerolog.Logger }

func (l promLogger) Println(v ...any) {
	l.log.Warn().Str("error", strings.TrimSpace(fmt.Sprintln(v...))).Msg("metrics scrape")
}

// ---- client commands --------------------------------------------------

func clientFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "server", Aliases: []string{"s"}, Value: "nats://127.0.0.1:4222", Usage: "NATS URL of a running jobq serve"},
		&cli.StringFlag{Name: "token", Usage: "token to authenticate with"},
		&cli.StringFlag{Name: "user", Usage: "user to authenticate with"},
		&cli.StringFlag{Name: "password", Usage: "password to authenticate with"},
		&cli.StringFlag{Name: "nkey-seed", Usage: "file holding an nkey seed to authenticate with"},
		&cli.StringFlag{Name: "tls-ca", Usage: "CA certificate file to verify the server's TLS certificate"},
		&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "how long to wait for the server"},
		&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		&cli.StringFlag{Name: "config", Usage: "YAML file of settings keyed by flag name (e.g. workers: 8); flags and JOBQ_* variables override it"},
	}
}

// maxTimeout bounds --timeout, which enqueue waits four times over.
const maxTimeout = 24 * time.Hour

// connect dials url with the command's credentials.
func connect(c *cli.Context, url string) (*nats.Conn, error) {
	timeout := c.Duration("timeout")
	if timeout == 0 && !c.IsSet("timeout") {
		timeout = 5 * time.Second // serve --server has no --timeout
	}
	if timeout <= 0 || timeout > maxTimeout {
		return nil, badUsage("--timeout %s: want a positive duration of at most %s", timeout, maxTimeout)
	}
	if err := validServerURLs(url); err != nil {
		return nil, usageError{err}
	}
	opts := []nats.Option{nats.Name("jobq " + c.Command.Name), nats.Timeout(timeout)}
	if c.Command.Name == "serve" {
		// A serve outlives outages of its --server: nats.go's default gives
		// up after 60 tries (2 minutes), leaving the workers on a closed
		// connection for good.
		opts = append(opts, nats.MaxReconnects(-1))
	}
	if t := c.String("token"); t != "" {
		opts = append(opts, nats.Token(t))
	}
	if u := c.String("user"); u != "" {
		opts = append(opts, nats.UserInfo(u, c.String("password")))
	} else if c.String("password") != "" {
		// Not sent at all: the server would refuse the connection, its
		// cause unsaid.
		return nil, badUsage("--password without --user: pass both")
	}
	if f := c.String("nkey-seed"); f != "" {
		o, err := nats.NkeyOptionFromSeed(f)
		if err != nil && nkeySeed.MatchString(f) {
			return nil, badUsage("--nkey-seed is given an nkey seed, a secret (not shown): pass the name of a file holding it, readable by you alone")
		}
		if err != nil {
			return nil, badUsage("--nkey-seed %s: %v", f, err)
		}
		opts = append(opts, o)
	}
	if f := c.String("tls-ca"); f != "" {
		if _, err := os.Stat(f); err != nil {
			return nil, badUsage("--tls-ca: %v", err)
		}
		opts = append(opts, nats.RootCAs(f))
	}
	nc, err := nats.Connect(url, opts...)
	switch {
	case errors.Is(err, nats.ErrAuthorization):
		return nil, fmt.Errorf("the jobq server at %s refused the credentials: %w; pass those jobq serve was started with (--token, --user and --password, or --nkey-seed)", redactURL(url), err)
	case errors.As(err, new(x509.HostnameError)):
		return nil, fmt.Errorf("the TLS certificate of the server at %s is not for that host: %w; connect by a name or address the certificate holds", redactURL(url), err)
	case errors.As(err, new(*tls.CertificateVerificationError)):
		return nil, fmt.Errorf("cannot trust the TLS certificate of the server at %s: %w; pass the CA that signed it with --tls-ca", redactURL(url), err)
	case err != nil && c.Command.Name == "serve":
		return nil, fmt.Errorf("cannot reach the NATS server at %s: %w; check --server, or leave it out for the embedded one", redactURL(url), err)
	case err != nil:
		return nil, fmt.Errorf("cannot reach a jobq server at %s: %w; start one with `jobq serve` or pass --server", redactURL(url), err)
	}
	return nc, nil
}

// untilSignal returns a context that SIGINT or SIGTERM ends; a second
// signal ends jobq at once, as the signal's default does. Call stop once
// through.
func untilSignal(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	ctx, stop = signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}

// nkeySeed matches an nkey seed itself, also one cut short or mistyped, as
// opposed to the name of a file holding one: every seed starts with S and
// is written in base32.
var nkeySeed = regexp.MustCompile(`^S[A-Z2-7]{40,}$`)

// validServerURLs checks a --server value: NATS URLs, comma-separated, as
// nats://host:port (tls://, ws:// and wss:// too).
func validServerURLs(urls string) error {
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			continue // nats.go skips an empty entry, as a trailing comma leaves
		}
		full := u
		if !strings.Contains(u, "://") {
			full = "nats://" + u // as nats.go reads a bare host:port
		}
		p, err := neturl.Parse(full)
		if err != nil || p.Host == "" {
			return fmt.Errorf("--server %q: want a NATS URL such as nats://127.0.0.1:4222", redactURL(u))
		}
		switch p.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("--server %q: unknown scheme %q; want nats://, tls://, ws:// or wss://", redactURL(u), p.Scheme)
		}
	}
	return nil
}

// redactURL hides credentials in a URL, or in each of a comma-separated
// list of them (a --server for a cluster), for messages and logs: the user
// info is what comes before the last "@" of the host part, as url.Parse
// reads it.
func redactURL(u string) string {
	if !strings.Contains(u, "@") {
		return u
	}
	parts := strings.Split(u, ",")
	for n, p := range parts {
		start := 0
		if j := strings.Index(p, "://"); j >= 0 {
			start = j + 3
		}
		end := len(p)
		// Where url.Parse finds user info, the host part ends at its
		// first "/?#"; a URL it cannot read (a password holding one of
		// them, not escaped) is hidden up to its last "@".
		if pu, err := neturl.Parse(p); err == nil && pu.User != nil {
			if k := strings.IndexAny(p[start:], "/?#"); k >= 0 {
				end = start + k
			}
		}
		if i := strings.LastIndex(p[start:end], "@"); i >= 0 {
			parts[n] = p[:start] + "***" + p[start+i:]
		}
	}
	return strings.Join(parts, ",")
}

// client opens jobq's objects on the command's server.
func client(c *cli.Context) (*queue.Objects, func(), error) {
	if strings.TrimSpace(c.String("server")) == "" {
		return nil, nil, badUsage("--server is empty (is JOBQ_SERVER set to nothing?); pass a NATS URL, or unset it for nats://127.0.0.1:4222")
	}
	nc, err := connect(c, c.String("server"))
	if err != nil {
		return nil, nil, err
	}
	// --timeout bounds each request a command makes of the server, also
	// those made without a deadline of their own.
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(c.Duration("timeout")))
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("open jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	obj, err := queue.Open(ctx, js)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("%w; is `jobq serve` running on %s?", err, redactURL(c.String("server")))
	}
	return obj, nc.Close, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func enqueueCommand() *cli.Command {
	return &cli.Command{
		Name:      "enqueue",
		Usage:     "store one job; payload from the argument, --file or stdin",
		ArgsUsage: "SUBJECT [PAYLOAD]",
		Flags: append(clientFlags(),
			&cli.StringFlag{Name: "id", Usage: "job ID (Nats-Msg-Id); default a fresh unique ID"},
			&cli.StringSliceFlag{Name: "header", Aliases: []string{"H"}, Usage: "header key=value (repeatable)"},
			&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Usage: "read the payload from this file"},
			&cli.IntFlag{Name: "max-payload", Value: queue.DefaultMaxPayload, Usage: "largest payload accepted, in bytes"},
		),
		Action: enqueue,
	}
}

func enqueue(c *cli.Context) error {
	if c.NArg() < 1 || c.NArg() > 2 {
		return badUsage("enqueue takes SUBJECT [PAYLOAD], e.g. jobq enqueue job.email '{\"to\":\"a@b.c\"}'")
	}
	subject := c.Args().Get(0)
	if err := handlers.ValidSubject(subject); err != nil {
		return usageError{err}
	}
	if err := queue.ValidID(c.String("id")); c.IsSet("id") && err != nil {
		return usageError{err}
	}
	if c.IsSet("id") && c.String("id") == "" {
		// Most likely an unset variable: a fresh ID would enqueue the job
		// again on every retry.
		return badUsage("--id is empty; leave it out for a fresh ID")
	}
	if err := checkMaxPayload(c); err != nil {
		return err
	}
	var payload []byte
	var err error
	switch {
	case c.NArg() == 2 && c.IsSet("file"):
		return badUsage("give the payload as an argument or --file, not both")
	case c.NArg() == 2:
		payload = []byte(c.Args().Get(1))
	case c.IsSet("file"):
		f, err := os.Open(c.String("file"))
		if errors.Is(err, fs.ErrNotExist) {
			return badUsage("--file %s: no such file", c.String("file"))
		}
		if err != nil {
			return fmt.Errorf("read payload from --file %s: %w", c.String("file"), err)
		}
		// Read no further than the limit: the file may be a pipe, or
		// /dev/zero.
		payload, err = io.ReadAll(io.LimitReader(f, int64(c.Int("max-payload"))+1))
		f.Close()
		if err != nil {
			return fmt.Errorf("read payload from --file %s: %w", c.String("file"), err)
		}
	default:
		if f, ok := c.App.Reader.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			break // nothing piped in: an empty payload
		}
		if payload, err = io.ReadAll(io.LimitReader(c.App.Reader, int64(c.Int("max-payload"))+1)); err != nil {
			return fmt.Errorf("read payload from stdin: %w", err)
		}
	}
	if len(payload) > c.Int("max-payload") {
		return badUsage("payload too large: over the limit of %d bytes (--max-payload)", c.Int("max-payload"))
	}
	header := nats.Header{}
	for _, kv := range c.StringSlice("header") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return badUsage("-H %q: want key=value", kv)
		}
		if k = strings.TrimSpace(k); strings.EqualFold(k, nats.MsgIdHdr) {
			return badUsage("-H %s: set the job ID with --id", k)
		}
		header.Add(k, v)
	}
	if err := queue.ValidHeader(header); err != nil {
		return usageError{err} // before connecting: a bad -H is bad usage, a server up or not
	}
	obj, closeFn, err := client(c)
	if err != nil {
		return err
	}
	defer closeFn()
	p := queue.NewProducer(obj.JS, queue.Config{MaxPayload: c.Int("max-payload")}).JOBLimit(obj).AttemptTimeout(c.Duration("timeout"))
	id := c.String("id")
	ctx, cancel := context.WithTimeout(c.Context, 4*c.Duration("timeout"))
	defer cancel()
	ack, err := p.Enqueue(ctx, subject, payload, queue.EnqueueOptions{ID: id, Header: header})
	if err != nil {
		if errors.Is(err, queue.ErrPayloadTooLarge) || errors.Is(err, queue.ErrBadHeader) || errors.Is(err, queue.ErrBadID) {
			return usageError{err}
		}
		return err
	}
	out := struct {
		Stream    string `json:"stream"`
		Seq       uint64 `json:"seq"`
		Duplicate bool   `json:"duplicate"`
	}{ack.Stream, ack.Sequence, ack.Duplicate}
	var werr error
	if c.Bool("json") {
		werr = printJSON(c.App.Writer, out)
	} else {
		_, werr = fmt.Fprintf(c.App.Writer, "stream: %s\nseq: %d\nduplicate: %t\n", out.Stream, out.Seq, out.Duplicate)
	}
	if werr != nil {
		// Said so, a script does not enqueue it again under a new ID.
		return fmt.Errorf("job stored at seq %d of %s, but its output could not be written: %w", out.Seq, out.Stream, werr)
	}
	return nil
}

func importCommand() *cli.Command {
	return &cli.Command{
		Name:      "import",
		Usage:     "store jobs from NDJSON, one {\"subject\", \"id\", \"payload\", \"headers\"} object a line; FILE - reads stdin",
		ArgsUsage: "FILE|-",
		Flags: append(clientFlags(),
			&cli.IntFlag{Name: "window", Value: queue.DefaultImportWindow, Usage: "publishes waiting for their ack at most"},
			&cli.BoolFlag{Name: "strict", Usage: "stop at the first malformed line (exit 2) instead of skipping it"},
			&cli.IntFlag{Name: "max-payload", Value: queue.DefaultMaxPayload, Usage: "largest payload accepted, in bytes"},
		),
		Action: importJobs,
	}
}

func importJobs(c *cli.Context) error {
	if c.NArg() != 1 {
		return badUsage("import takes one FILE, or - for stdin, e.g. jobq import jobs.ndjson")
	}
	if w := c.Int("window"); w < 1 || w > maxImportWindow {
		return badUsage("--window %d: want 1 to %d", w, maxImportWindow)
	}
	if err := checkMaxPayload(c); err != nil {
		return err
	}
	in := c.App.Reader
	if name := c.Args().First(); name != "-" {
		f, err := os.Open(name)
		if errors.Is(err, fs.ErrNotExist) {
			return badUsage("import %s: no such file", name)
		}
		if err != nil {
			return fmt.Errorf("read jobs: %w", err)
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			return badUsage("import %s: is a directory; give a file of NDJSON lines, or - for stdin", name)
		}
		in = f
	}
	total, err := countJobLines(in)
	if err != nil {
		return err
	}
	obj, closeFn, err := client(c)
	if err != nil {
		return err
	}
	defer closeFn()
	ctx, stop := untilSignal(c.Context)
	defer stop()
	progress := newImportProgress(c.App.ErrWriter, total)
	p := queue.NewProducer(obj.JS, queue.Config{MaxPayload: c.Int("max-payload")}).JOBLimit(obj).AttemptTimeout(c.Duration("timeout"))
	sum, err := queue.Import(ctx, p, in, queue.ImportOptions{
		Window:           c.Int("window"),
		Strict:           c.Bool("strict"),
		AckTimeout:       c.Duration("timeout"),
		Progress:         progress.update,
		ProgressInterval: 200 * time.Millisecond,
	})
	progress.end()
	if c.Bool("json") {
		if sum.Errors == nil {
			sum.Errors = []queue.LineError{}
		}
		printJSON(c.App.Writer, sum)
	} else {
		printImportSummary(c.App.Writer, sum)
	}
	switch {
	case errors.Is(err, queue.ErrMalformed):
		return usageError{err}
	case err != nil:
		return err
	case sum.Malformed > 0 || sum.Failed > 0:
		return fmt.Errorf("%d of %d lines not stored (%d malformed, %d failed): see the summary above", sum.Malformed+sum.Failed, sum.Lines, sum.Malformed, sum.Failed)
	}
	return nil
}

// countJobLines counts the job lines of a regular file and rewinds it, for
// the progress bar's total; -1 for other input.
func countJobLines(in io.Reader) (int, error) {
	f, ok := in.(*os.File)
	if !ok {
		return -1, nil
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return -1, nil
	}
	start, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return -1, nil
	}
	n, err := queue.CountLines(f)
	if _, serr := f.Seek(start, io.SeekStart); serr != nil {
		return -1, fmt.Errorf("rewind %s: %w", f.Name(), serr)
	}
	if err != nil {
		return -1, fmt.Errorf("read jobs: %w", err)
	}
	return n, nil
}

// importProgress shows an import's progress: on a terminal a line redrawn
// in place, a bar with rate and ETA when the total is known; otherwise a
// line a second.
type importProgress struct {
	w           io.Writer
	tty         bool
	total       int // -1: unknown
	start, last time.Time
	drawn       bool
}

func newImportProgress(w io.Writer, total int) *importProgress {
	now := time.Now()
	return &importProgress{w: w, tty: terminal(w), total: total, start: now, last: now}
}

func (p *importProgress) update(s queue.ImportSummary) {
	now := time.Now()
	if !p.tty && now.Sub(p.last) < time.Second {
		return
	}
	p.last = now
	done := s.Done()
	rate := float64(done) / max(now.Sub(p.start).Seconds(), 1e-3)
	var line string
	switch {
	case p.total >= 0:
		eta := "?"
		if rate > 0 {
			eta = (time.Duration(float64(max(p.total-done, 0))/rate) * time.Second).String()
		}
		line = fmt.Sprintf("%d/%d lines  %.0f/s  ETA %s", done, p.total, rate, eta)
		if p.tty {
			const width = 30
			filled := min(width, done*width/max(p.total, 1))
			line = "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "] " + line
		}
	default:
		line = fmt.Sprintf("%d lines  %.0f/s", done, rate)
	}
	if n := s.Malformed + s.Failed; n > 0 {
		line += fmt.Sprintf("  %d not stored", n)
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[Kimport %s", line)
		p.drawn = true
		return
	}
	fmt.Fprintf(p.w, "import: %s\n", line)
}

// end clears the terminal line.
func (p *importProgress) end() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

func printImportSummary(w io.Writer, s queue.ImportSummary) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "lines:\t%d\nstored:\t%d\nduplicates:\t%d\nmalformed:\t%d\nfailed:\t%d\n", s.Lines, s.Stored, s.Duplicates, s.Malformed, s.Failed)
	tw.Flush()
	for _, e := range s.Errors {
		fmt.Fprintf(w, "line %d: %s\n", e.Line, e.Reason)
	}
	if more := s.Malformed + s.Failed - len(s.Errors); more > 0 {
		fmt.Fprintf(w, "… and %d more\n", more)
	}
}

func nextCommand() *cli.Command {
	return &cli.Command{
		Name:  "next",
		Usage: "take one job from WORKER, print it and record it done (--no-ack: only show the next one)",
		Flags: append(clientFlags(),
			&cli.BoolFlag{Name: "no-ack", Usage: "only show the next job waiting for its first delivery, without delivering it"},
			&cli.DurationFlag{Name: "wait", Value: 5 * time.Second, Usage: "how long to wait for a job"},
		),
		Action: next,
	}
}

func next(c *cli.Context) error {
	if c.NArg() > 0 {
		return badUsage("next takes no arguments")
	}
	if c.Duration("wait") < 0 {
		return badUsage("--wait %s: want 0 or more", c.Duration("wait"))
	}
	// A closed pipe (jobq next | head -1) fails the print, as any write
	// error does, rather than kill jobq while it holds the job: the attempt
	// then counts as failed, and the job is not left on a dead lease.
	signal.Ignore(syscall.SIGPIPE)
	obj, closeFn, err := client(c)
	if err != nil {
		return err
	}
	defer closeFn()
	// From here on a signal ends next in order: a job taken and not
	// shown is handed back. A second signal ends jobq at once.
	ctx, stop := untilSignal(c.Context)
	defer stop()
	var printErr error // the job could not be printed: it is not done
	var shown string
	show := func(job *data.Job) error {
		shown, printErr = job.ID, printJob(c, job)
		return printErr
	}
	var got bool
	if c.Bool("no-ack") {
		got, err = queue.Peek(ctx, obj, c.Duration("wait"), show)
	} else {
		got, err = queue.Next(ctx, obj, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
			return show(job)
		}), c.Duration("wait"), zerolog.Nop())
	}
	// Once the job was shown, Next's own error says what became of it.
	if shown == "" && (!got || err != nil) && ctx.Err() != nil && c.Context.Err() == nil {
		return errors.New("next stopped by a signal; a job it had taken, if any, is handed back unshown")
	}
	if err != nil {
		return err
	}
	if printErr != nil && !c.Bool("no-ack") {
		return fmt.Errorf("print job %s: %w; the attempt counts as failed: it is retried, or after its last delivery dead-lettered (see jobq job %s)", shown, printErr, shown)
	}
	if !got {
		return fmt.Errorf("no job on %s %s within %s", queue.StreamJob, queue.ConsumerWorker, c.Duration("wait"))
	}
	return nil
}

func printJob(c *cli.Context, job *data.Job) error {
	if c.Bool("json") {
		// An ID may be any bytes but control characters: one that is
		// not UTF-8 is also given as it is, in base64 (id_base64), as
		// JSON text would turn each such byte into U+FFFD.
		var idBase64 string
		if !utf8.ValidString(job.ID) {
			idBase64 = base64.StdEncoding.EncodeToString([]byte(job.ID))
		}
		return printJSON(c.App.Writer, struct {
			ID       string              `json:"id"`
			IDBase64 string              `json:"id_base64,omitempty"`
			Subject  string              `json:"subject"`
			Seq      uint64              `json:"seq"`
			Attempt  int                 `json:"attempt"`
			Resumed  bool                `json:"resumed"`
			Header   map[string][]string `json:"headers,omitempty"`
			jsonPayload
		}{job.ID, idBase64, job.Subject, job.Seq, job.Attempt, job.Resumed, job.Header, payloadJSON(job.Payload)})
	}
	w := &errWriter{w: c.App.Writer}
	fmt.Fprintf(w, "id: %s\nsubject: %s\nseq: %d\nattempt: %d\n", job.ID, job.Subject, job.Seq, job.Attempt)
	for k, vs := range job.Header {
		for _, v := range vs {
			fmt.Fprintf(w, "header: %s: %s\n", k, v)
		}
	}
	fmt.Fprintf(w, "\n%s\n", job.Payload)
	return w.err
}

// jsonPayload is a payload in --json output: as text (payload) when it is
// UTF-8, else in base64 (payload_base64), as import takes it: as JSON text,
// each byte that is not UTF-8 would turn into U+FFFD.
type jsonPayload struct {
	Payload       *string `json:"payload,omitempty"`
	PayloadBase64 string  `json:"payload_base64,omitempty"`
}

func payloadJSON(b []byte) jsonPayload {
	if utf8.Valid(b) {
		s := string(b)
		return jsonPayload{Payload: &s}
	}
	return jsonPayload{PayloadBase64: base64.StdEncoding.EncodeToString(b)}
}

// terminal reports whether w, or the writer an errWriter w wraps, is a
// terminal.
func terminal(w io.Writer) bool {
	if e, ok := w.(*errWriter); ok {
		w = e.w
	}
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd())
}

// errWriter keeps the first error of its writes.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show stream, consumer, dead-letter and ledger counts (--watch: again every --interval)",
		Flags: append(clientFlags(),
			&cli.BoolFlag{Name: "watch", Aliases: []string{"w"}, Usage: "show the counts again every --interval until Ctrl-C"},
			&cli.DurationFlag{Name: "interval", Value: 2 * time.Second, Usage: "how often --watch shows the counts"},
			&cli.IntFlag{Name: "count", Hidden: true, Usage: "with --watch, stop after this many tables (for tests)"},
		),
		Action: status,
	}
}

func status(c *cli.Context) error {
	if c.NArg() > 0 {
		return badUsage("status takes no arguments")
	}
	interval := c.Duration("interval")
	if c.Bool("watch") && interval <= 0 {
		return badUsage("--interval %s: want a positive duration such as 2s", interval)
	}
	obj, closeFn, err := client(c)
	if err != nil {
		return err
	}
	defer closeFn()
	read := func() (queue.Status, error) {
		ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
		defer cancel()
		return queue.ReadStatus(ctx, obj)
	}
	w, asJSON := c.App.Writer, c.Bool("json")
	tty := terminal(w)
	_, noColor := os.LookupEnv("NO_COLOR")
	colour := tty && !noColor
	if !c.Bool("watch") {
		st, err := read()
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(w, st)
		}
		_, err = io.WriteString(w, statusTable(st, colour))
		return err
	}

	// --watch: on a terminal the table is redrawn in place; elsewhere each
	// one follows the last, under its time (--json: one object a line).
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for n := 1; ; n++ {
		st, err := read()
		var b strings.Builder
		switch {
		case asJSON:
		case tty:
			b.WriteString("\x1b[H\x1b[2J") // cursor home, clear the screen
			fmt.Fprintf(&b, "every %s, %s (Ctrl-C stops)\n\n", interval, time.Now().Format(time.TimeOnly))
		default:
			if n > 1 {
				b.WriteByte('\n')
			}
			fmt.Fprintf(&b, "%s\n", time.Now().Format(time.DateTime))
		}
		switch {
		case err != nil && tty && !asJSON:
			fmt.Fprintf(&b, "cannot read the status: %s; trying again\n", oneLine(err.Error()))
		case err != nil: // shown, then tried again next time
			fmt.Fprintf(c.App.ErrWriter, "jobq: %s\n", oneLine(err.Error()))
		case asJSON:
			line, _ := json.Marshal(st)
			b.Write(line)
			b.WriteByte('\n')
		default:
			b.WriteString(statusTable(st, colour))
		}
		if _, err := io.WriteString(w, b.String()); err != nil {
			return err
		}
		if limit := c.Int("count"); limit > 0 && n >= limit {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// statusTable renders st as jobq status's aligned table, with sizes and
// durations for people; with colour a non-zero dead-letter count is red.
func statusTable(st queue.Status, colour bool) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	seqs := fmt.Sprintf("seq %d..%d", st.Stream.FirstSeq, st.Stream.LastSeq)
	if st.Stream.Messages == 0 {
		seqs = fmt.Sprintf("last seq %d", st.Stream.LastSeq)
	}
	dead := fmt.Sprintf("%d jobs", st.DLQ.Messages)
	fmt.Fprintf(tw, "stream %s\t%d jobs\t%s\t%s\tdedupe window %s\n", st.Stream.Name, st.Stream.Messages, dashboard.HumanSize(st.Stream.Bytes), seqs, dashboard.HumanSpan(st.Stream.DedupeWindow))
	fmt.Fprintf(tw, "consumer %s\t%d pending\t%d ack pending\t%d redelivered\tmax deliver %d, ack wait %s\n", st.Consumer.Name, st.Consumer.Pending, st.Consumer.AckPending, st.Consumer.Redelivered, st.Consumer.MaxDeliver, dashboard.HumanSpan(st.Consumer.AckWait))
	fmt.Fprintf(tw, "dead letters %s\t%s\t%s\t\t\n", st.DLQ.Name, dead, dashboard.HumanSize(st.DLQ.Bytes))
	leases := fmt.Sprintf("%d pool leases", st.Ledger.Leases)
	if st.Ledger.Leases == 1 {
		leases = "1 pool lease"
	}
	fmt.Fprintf(tw, "ledger %s\t%d records\t%s\tttl %s\t%s\n", st.Ledger.Bucket, st.Ledger.Records, dashboard.HumanSize(st.Ledger.Bytes), dashboard.HumanSpan(st.Ledger.TTL), leases)
	tw.Flush()
	out := b.String()
	if colour && st.DLQ.Messages > 0 {
		// Coloured after the alignment, so the escapes take no column.
		line := strings.Index(out, "dead letters ")
		i := line + strings.Index(out[line:], dead)
		out = out[:i] + "\x1b[1;31m" + dead + "\x1b[0m" + out[i+len(dead):]
	}
	return out
}

func jobCommand() *cli.Command {
	return &cli.Command{
		Name:      "job",
		Usage:     "show a job's ledger record: state, attempts, worker, times, last error",
		ArgsUsage: "ID",
		Flags:     clientFlags(),
		Action:    job,
	}
}

func job(c *cli.Context) error {
	if c.NArg() != 1 {
		return badUsage("job takes one job ID, e.g. jobq job payroll-42")
	}
	if c.Args().First() == "" {
		return badUsage("job ID is empty: pass one, e.g. jobq job payroll-42")
	}
	obj, closeFn, err := client(c)
	if err != nil {
		return err
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	rec, err := queue.LookUp(ctx, obj, c.Args().First())
	if errors.Is(err, data.ErrNotFound) {
		return fmt.Errorf("no ledger record for job %q: it is pending, unknown, or its record expired (--processed-ttl)", c.Args().First())
	}
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, rec)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", k, v)
		}
	}
	ts := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.Local().Format(time.RFC3339Nano)
	}
	row("id", rec.ID)
	row("state", string(rec.State))
	row("subject", rec.Subject)
	row("seq", strconv.FormatUint(rec.Seq, 10))
	if rec.State == queue.StateLeased {
		row("record", "none yet: it runs on its pool's lease, or waits there for a worker; its record is written when it ends")
	} else {
		row("attempts", strconv.Itoa(rec.Attempts))
	}
	row("worker", rec.Worker)
	if rec.Resumed {
		row("resumed", "yes: an earlier attempt never recorded an outcome")
	}
	row("first started", ts(rec.FirstAt))
	row("last started", ts(rec.StartedAt))
	row("finished", ts(rec.FinishedAt))
	if rec.Took > 0 {
		row("took", rec.Took.String())
	}
	if rec.State == data.StateRunning || rec.State == queue.StateLeased {
		until := ts(rec.LeaseUntil)
		if queue.ClaimLapsed(rec, time.Now()) {
			until += " (lapsed: not renewed by its end; its worker stopped, lost the server, or cannot write the ledger. A later delivery, if one is left, runs it again as resumed; else the sweep dead-letters it)"
		}
		row("lease until", until)
	}
	row("last error", rec.LastError)
	return tw.Flush()
}

func dlqCommand() *cli.Command {
	return &cli.Command{
		Name:  "dlq",
		Usage: "inspect, re-drive and delete dead letters",
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return badUsage("unknown command \"dlq %s\": want dlq list, show, retry, rm or purge", c.Args().First())
			}
			return cli.ShowSubcommandHelp(c)
		},
		Subcommands: []*cli.Command{
			{Name: "list", Usage: "list dead letters, oldest first", Flags: append(clientFlags(), &cli.IntFlag{Name: "limit", Value: 100, Usage: "at most this many (0: all)"}), Action: dlqList},
			{Name: "show", Usage: "show one dead letter with its payload", ArgsUsage: "DLQ-SEQ|JOB-ID", Flags: append(clientFlags(), idFlag()), Action: dlqShow},
			{Name: "retry", Usage: "enqueue dead letters again and remove them from DLQ", ArgsUsage: "DLQ-SEQ|JOB-ID", Flags: append(clientFlags(), idFlag(), &cli.BoolFlag{Name: "all", Usage: "retry every dead letter"}), Action: dlqRetry},
			{Name: "rm", Aliases: []string{"remove"}, Usage: "delete a dead letter for good, or every dead letter of a job ID, without running it", ArgsUsage: "DLQ-SEQ|JOB-ID", Flags: append(clientFlags(), idFlag()), Action: dlqRemove},
			{Name: "purge", Usage: "delete every dead letter", Flags: clientFlags(), Action: dlqPurge},
		},
	}
}

func dlqList(c *cli.Context) error {
	if c.NArg() > 0 {
		return badUsage("dlq list takes no arguments")
	}
	if c.Int("limit") < 0 {
		return badUsage("--limit %d: want 0 (all) or more", c.Int("limit"))
	}
	obj, closeFn, err := client(c)
	if err != nil {
		return err
	}
	defer closeFn()
	// One dead letter at a time, its payload let go at once: the list
	// holds none, so a DLQ of large payloads is never in memory whole.
	list := []queue.DeadLetter{}
	err = queue.EachDeadLetter(c.Context, obj, func(d queue.DeadLetter) error {
		d.Payload = nil
		if list = append(list, d); c.Int("limit") > 0 && len(list) >= c.Int("limit") {
			return errListed
		}
		return nil
	})
	if err != nil && !errors.Is(err, errListed) {
		return err
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, list)
	}
	if len(list) == 0 {
		fmt.Fprintln(c.App.Writer, "no dead letters")
		return nil
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DLQ-SEQ\tJOB ID\tSUBJECT\tATTEMPTS\tFAILED AT\tERROR")
	for _, d := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", d.Seq, d.ID, d.Subject, d.Attempts, d.FailedAt.Local().Format(time.DateTime), truncate(d.Error, 80))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if limit := c.Int("limit"); limit > 0 && len(list) == limit {
		if n, err := queue.DeadLetterCount(c.Context, obj); err == nil && n > uint64(limit) {
			fmt.Fprintf(c.App.Writer, "… and %d more (--limit 0 shows all)\n", n-uint64(limit))
		}
	}
	return nil
}

// errListed ends a dlq list that has its --limit.
var errListed = errors.New("listed enough")

// truncate cuts s to at most n bytes and marks the cut, at a character's
// start: never inside a UTF-8 character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return queue.CutUTF8(s, n-len("…")) + "…"
}

// idFlag makes dlq show and retry take their argument as a job ID, also
// when it is a number (a DLQ sequence otherwise).
func idFlag() cli.Flag {
	return &cli.BoolFlag{Name: "by-id", Usage: "the argument is a job ID, also if it is a number"}
}

// findDeadLetter finds the dead letter c's argument names (see idFlag).
func findDeadLetter(c *cli.Context, obj *queue.Objects) (queue.DeadLetter, error) {
	ref := c.Args().First()
	if c.Bool("by-id") {
		return queue.DeadLetterOf(c.Context, obj, ref)
	}
	return queue.FindDeadLetter(c.Context, obj, ref)
}

func dlqShow(c *cli.Context) error {
	if c.NArg() != 1 {
		return badUsage("dlq show takes a DLQ sequence or job ID (see jobq dlq list)")
	}
	if c.Args().First() == "" {
		return badUsage("dlq show: the argument is empty (is a shell variable unset?); pass a DLQ sequence or job ID (see jobq dlq list)")
	}
	obj, closeFn, err := client(c)
	if err != nil {
		return err
	}
	defer closeFn()
	d, err := findDeadLetter(c, obj)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		// The payload as jobq next --json prints it (see payloadJSON).
		p := payloadJSON(d.Payload)
		return printJSON(c.App.Writer, struct {
			queue.DeadLetter
			Payload       *string `json:"payload,omitempty"`
			PayloadBase64 string  `json:"payload_base64,omitempty"`
		}{d, p.Payload, p.PayloadBase64})
	}
	w := c.App.Writer
	fmt.Fprintf(w, "dlq seq: %d\nid: %s\nsubject: %s\njob seq: %d\nattempts: %d\nfailed at: %s\nerror: %s\n", d.Seq, d.ID, d.Subject, d.JobSeq, d.Attempts, d.FailedAt.Local().Format(time.RFC3339), d.Error)
	for k, vs := range d.Header {
		for _, v := range vs {
			fmt.Fprintf(w, "header: %s: %s\n", k, v)
		}
	}
	fmt.Fprintf(w, "\n%s\n", d.Payload)
	return nil
}

func dlqRetry(c *cli.Context) error {
	if c.Bool("all") == (c.NArg() == 1) || c.NArg() > 1 {
		return badUsage("dlq retry takes one DLQ sequence or job ID, or --all")
	}
	if c.Bool("all") && c.Bool("by-id") {
		return badUsage("--by-id says what the argument is; dlq retry --all takes none")
	}
	if !c.Bool("all") && c.Args().First() == "" {
		return badUsage("dlq retry: the argument is empty (is a shell variable unset?); pass a DLQ sequence or job ID (see jobq dlq list), or --all")
	}
	obj, closeFn, err := client(c)
	if err != nil {
		return err
	}
	defer closeFn()
	type result struct {
		ID     string `json:"id"`
		DLQSeq uint64 `json:"dlq_seq"`
		Seq    uint64 `json:"seq"`
		// RunsAs: the ID the re-drive runs under, when not ID (see
		// queue.Redrive).
		RunsAs string `json:"runs_as,omitempty"`
		// Done: recorded done already, so it is acked without running.
		Done bool `json:"done,omitempty"`
	}
	results := []result{}
	retry := func(d queue.DeadLetter) error {
		// A dead letter re-enqueued and not removed from DLQ comes with
		// both: it counts as retried.
		r, err := queue.RetryDeadLetter(c.Context, obj, d)
		if r != nil {
			res := result{ID: d.ID, DLQSeq: d.Seq, Seq: r.Sequence, Done: r.Done}
			if r.ID != d.ID {
				res.RunsAs = r.ID
			}
			results = append(results, res)
			if !c.Bool("json") {
				fmt.Fprintf(c.App.Writer, "retried %s (dlq seq %d) as %s seq %d", d.ID, d.Seq, queue.StreamJob, r.Sequence)
				if res.RunsAs != "" {
					fmt.Fprintf(c.App.Writer, ", under the ID %s (%s was made anew since)", res.RunsAs, queue.StreamJob)
				}
				if r.Done {
					fmt.Fprintf(c.App.Writer, "; it is recorded done already, so it is acked without running (see jobq job %s)", r.ID)
				}
				fmt.Fprintln(c.App.Writer)
			}
		}
		if err != nil && c.Bool("json") && len(results) > 0 {
			printJSON(c.App.Writer, results) // what was re-enqueued
		}
		return err
	}
	if c.Bool("all") {
		// One dead letter read at a time: a DLQ of large payloads is never
		// in memory whole.
		total, err := queue.DeadLetterCount(c.Context, obj)
		if err != nil {
			return err
		}
		var failed *queue.DeadLetter
		err = queue.EachDeadLetter(c.Context, obj, func(d queue.DeadLetter) error {
			if err := retry(d); err != nil {
				failed = &d
				return err
			}
			return nil
		})
		if err != nil && failed == nil { // reading DLQ failed
			if len(results) == 0 {
				return err
			}
			if c.Bool("json") {
				printJSON(c.App.Writer, results) // what was re-enqueued
			}
			return fmt.Errorf("retried %d of %d dead letters; then %w", len(results), total, err)
		}
		if err != nil {
			return fmt.Errorf("retried %d of %d dead letters; %s (dlq seq %d): %w", len(results), total, failed.ID, failed.Seq, err)
		}
	} else {
		d, err := findDeadLetter(c, obj)
		if err != nil {
			return err
		}
		if err := retry(d); err != nil {
			return err
		}
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, results)
	}
	if len(results) == 0 {
		fmt.Fprintln(c.App.Writer, "no dead letters")
	}
	return nil
}

func dlqRemove(c *cli.Context) error {
	if c.NArg() != 1 {
		return badUsage("dlq rm takes one DLQ sequence or job ID (see jobq dlq list); jobq dlq purge deletes them all")
	}
	ref := c.Args().First()
	if ref == "" {
		return badUsage("dlq rm: the argument is empty (is a shell variable unset?); pass a DLQ sequence or job ID (see jobq dlq list)")
	}
	obj, closeFn, err := client(c)
	if err != nil {
		return err
	}
	defer closeFn()
	var removed []queue.DeadLetter
	// A number is a DLQ sequence alone: a dead letter gone from there
	// (removed by an earlier dlq rm) is not to be taken for the job of
	// that ID, which would be deleted in its place.
	if seq, ok := queue.DLQSeq(ref); ok && !c.Bool("by-id") {
		d, err := queue.DeadLetterAt(c.Context, obj, seq)
		if errors.Is(err, queue.ErrNoDeadLetter) {
			return fmt.Errorf("%w; for the job whose ID is %s, pass --by-id", err, ref)
		}
		if err == nil {
			err = queue.RemoveDeadLetter(c.Context, obj, d)
		}
		if err != nil {
			return err
		}
		removed = append(removed, d)
	} else if removed, err = queue.RemoveDeadLettersOf(c.Context, obj, ref); err != nil && len(removed) == 0 {
		return err
	}
	type result struct {
		ID     string `json:"id"`
		DLQSeq uint64 `json:"dlq_seq"`
	}
	results := []result{}
	for _, d := range removed {
		results = append(results, result{d.ID, d.Seq})
		if c.Bool("json") {
			continue
		}
		if d.ID == "" {
			fmt.Fprintf(c.App.Writer, "removed dlq seq %d (it had no job ID)\n", d.Seq)
		} else {
			fmt.Fprintf(c.App.Writer, "removed %s (dlq seq %d)\n", d.ID, d.Seq)
		}
	}
	if c.Bool("json") {
		if perr := printJSON(c.App.Writer, results); err == nil {
			err = perr
		}
	}
	return err // the removal that failed after others, if one did
}

func dlqPurge(c *cli.Context) error {
	if c.NArg() > 0 {
		return badUsage("dlq purge takes no arguments: it deletes every dead letter")
	}
	obj, closeFn, err := client(c)
	if err != nil {
		return err
	}
	defer closeFn()
	n, err := queue.PurgeDeadLetters(c.Context, obj)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c.App.Writer, map[string]uint64{"purged": n})
	}
	fmt.Fprintf(c.App.Writer, "purged %d dead letters\n", n)
	return nil
}

// ---- bench ------------------------------------------------------------

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure jobq against a raw JetStream baseline on a fresh temporary store",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "jobs", Value: 20000, Usage: "jobs per phase"},
			&cli.IntFlag{Name: "runs", Value: 3, Usage: "run the whole bench this many times and report each figure's median (1: one quick run)"},
			&cli.IntFlag{Name: "payload", Value: 128, Usage: "payload size in bytes"},
			&cli.IntFlag{Name: "workers", Value: 8, Usage: "jobq workers"},
			&cli.IntFlag{Name: "prefetch", Value: queue.DefaultPrefetch, Usage: "jobq prefetch"},
			&cli.StringFlag{Name: "sync", Value: "1s", Usage: "store fsync: an interval, or always"},
			&cli.StringFlag{Name: "dir", Usage: "where to put the temporary stores (default: the system temp dir)"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of the run to this file"},
		},
		Action: bench,
	}
}

// benchMaxPayload is the largest bench --payload: the bench's servers take
// messages of up to 1 MiB (server.Config's default), headers included.
const benchMaxPayload = 1<<20 - 4<<10

func bench(c *cli.Context) error {
	if c.NArg() > 0 {
		return badUsage("bench takes no arguments")
	}
	if c.Int("jobs") <= 0 || c.Int("workers") <= 0 || c.Int("runs") <= 0 {
		return badUsage("--jobs, --workers and --runs must be 1 or more")
	}
	if p := c.Int("payload"); p < queue.BenchMinPayload || p > benchMaxPayload {
		return badUsage("--payload %d: want %d (room for the time each job was sent and its number) to %d (what the bench's server takes, less room for headers)", p, queue.BenchMinPayload, benchMaxPayload)
	}
	if w, p := c.Int("workers"), c.Int("prefetch"); w > queue.MaxWorkers || p < 0 || p > queue.MaxPrefetch {
		return badUsage("--workers %d, --prefetch %d: want --workers 1 to %d, --prefetch 0 (the default) to %d", w, p, queue.MaxWorkers, queue.MaxPrefetch)
	}
	sc := server.Config{Logger: zerolog.Nop()}
	if err := syncFlag(c, &sc); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(c.String("dir"), "jobq-bench-")
	if err != nil {
		return fmt.Errorf("make bench dir: %w", err)
	}
	defer os.RemoveAll(dir)
	// A stop signal ends the bench, its stores removed.
	ctx, stop := untilSignal(c.Context)
	defer stop()
	if f := c.String("cpuprofile"); f != "" {
		out, err := os.Create(f)
		if err != nil {
			return fmt.Errorf("create cpu profile: %w", err)
		}
		defer out.Close()
		if err := pprof.StartCPUProfile(out); err != nil {
			return fmt.Errorf("start cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	progress := progressPrinter(c.App.ErrWriter)
	var runs []queue.BenchReport
	var failed error // a loss fails the bench, but the runs go on
	for i := range c.Int("runs") {
		cfg := queue.BenchConfig{
			Jobs: c.Int("jobs"), Payload: c.Int("payload"), Workers: c.Int("workers"), Prefetch: c.Int("prefetch"),
			Dir: filepath.Join(dir, strconv.Itoa(i+1)),
			Connect: func(ctx context.Context, dir string) (func() (*nats.Conn, error), func(), error) {
				cfg := sc
				cfg.StoreDir = dir
				srv, err := server.Start(ctx, cfg)
				if err != nil {
					return nil, nil, err
				}
				dial := func() (*nats.Conn, error) { return srv.Connect() }
				return dial, func() { srv.Shutdown(context.Background()) }, nil
			},
			Progress: progress,
			Log:      zerolog.Nop(),
		}
		if n := c.Int("runs"); n > 1 {
			cfg.Progress = func(mode, phase string, done, total int) {
				progress(fmt.Sprintf("%d/%d %s", i+1, n, mode), phase, done, total)
			}
		}
		rep, err := queue.Bench(ctx, cfg)
		if ctx.Err() != nil {
			failed = errors.New("bench stopped by a signal; its temporary stores are removed")
			break
		}
		switch {
		case err == nil || errors.Is(err, queue.ErrBenchLoss):
			runs = append(runs, rep)
		case len(runs) == 0 && c.Int("runs") == 1 && rep.Baseline.ProcessPerS > 0:
			runs = append(runs, rep) // what was measured, as it is
		}
		os.RemoveAll(cfg.Dir) // the next run gets fresh stores; dir goes at the end anyway
		if err != nil {
			failed = err
			if !errors.Is(err, queue.ErrBenchLoss) {
				break
			}
		}
	}
	progress("", "", 0, 0)
	if len(runs) > 0 {
		rep := queue.BenchMedian(runs)
		if c.Bool("json") {
			printJSON(c.App.Writer, rep)
		} else {
			printBench(c.App.Writer, rep, c.String("sync"))
		}
	}
	return failed
}

// progressPrinter draws a progress bar on a terminal, and a line per phase
// otherwise. Called with an empty mode, it ends the bar.
func progressPrinter(w io.Writer) func(mode, phase string, done, total int) {
	tty := terminal(w)
	last := ""
	return func(mode, phase string, done, total int) {
		key := mode + " " + phase
		switch {
		case mode == "":
			if tty {
				fmt.Fprint(w, "\r\033[K")
			}
		case tty:
			const width = 30
			filled := min(width, done*width/max(total, 1))
			fmt.Fprintf(w, "\r\033[K%-10s %-14s [%s%s] %d/%d", mode, phase, strings.Repeat("#", filled), strings.Repeat(".", width-filled), done, total)
		case key != last:
			fmt.Fprintf(w, "bench: %s %s\n", mode, phase)
		}
		last = key
	}
}

func printBench(w io.Writer, r queue.BenchReport, sync string) {
	fmt.Fprintf(w, "jobq bench: %d jobs, %d-byte payloads, %d workers, prefetch %d, sync %s", r.Jobs, r.Payload, r.Workers, r.Prefetch, sync)
	if len(r.Runs) > 1 {
		fmt.Fprintf(w, "; the median of %d runs", len(r.Runs))
	}
	fmt.Fprint(w, "\n\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tbaseline\tledger\tratio\tno ledger\tratio\t")
	// ratios: whether the row shows the ledger's and the no-ledger
	// figure's over the baseline's; over several runs, the median of each
	// run's own ratio, as the report's are.
	row := func(name string, f func(queue.BenchResult) float64, format string, ratios bool) {
		b, l, n := f(r.Baseline), f(r.Ledger), f(r.NoLedger)
		if ratios {
			lr, nr := r.Ratios(f)
			fmt.Fprintf(tw, "%s\t"+format+"\t"+format+"\t%.2fx\t"+format+"\t%.2fx\t\n", name, b, l, lr, n, nr)
			return
		}
		fmt.Fprintf(tw, "%s\t"+format+"\t"+format+"\t\t"+format+"\t\t\n", name, b, l, n)
	}
	row("enqueue jobs/s (one at a time)", func(b queue.BenchResult) float64 { return b.EnqueueSyncPerS }, "%.0f", true)
	row("enqueue jobs/s (async)", func(b queue.BenchResult) float64 { return b.EnqueueAsyncPerS }, "%.0f", true)
	row("process jobs/s", func(b queue.BenchResult) float64 { return b.ProcessPerS }, "%.0f", true)
	row("end-to-end jobs/s", func(b queue.BenchResult) float64 { return b.E2EPerS }, "%.0f", true)
	if r.Baseline.ProcessCPUUs > 0 {
		row("process CPU µs/job", func(b queue.BenchResult) float64 { return b.ProcessCPUUs }, "%.1f", true)
		row("end-to-end CPU µs/job", func(b queue.BenchResult) float64 { return b.E2ECPUUs }, "%.1f", true)
		row("process page faults/job", func(b queue.BenchResult) float64 { return b.ProcessFaults }, "%.2f", true)
		row("end-to-end page faults/job", func(b queue.BenchResult) float64 { return b.E2EFaults }, "%.2f", true)
	}
	row("latency p50 ms at 1000/s", func(b queue.BenchResult) float64 { return b.LatencyP50Ms }, "%.2f", false)
	row("latency p99 ms at 1000/s", func(b queue.BenchResult) float64 { return b.LatencyP99Ms }, "%.2f", false)
	row("latency max ms at 1000/s", func(b queue.BenchResult) float64 { return b.LatencyMaxMs }, "%.2f", false)
	row("latency p50 ms, saturated", func(b queue.BenchResult) float64 { return b.SaturatedP50Ms }, "%.0f", false)
	row("latency p99 ms, saturated", func(b queue.BenchResult) float64 { return b.SaturatedP99Ms }, "%.0f", false)
	row("peak RSS MB", func(b queue.BenchResult) float64 { return b.PeakRSSMB }, "%.0f", false)
	tw.Flush()
	for i, run := range r.Runs {
		fmt.Fprintf(w, "\nrun %d: ratios ledger process %.2f, end-to-end %.2f; no ledger process %.2f, end-to-end %.2f", i+1, run.Ratio.LedgerProcess, run.Ratio.LedgerE2E, run.Ratio.NoLedgerProcess, run.Ratio.NoLedgerE2E)
	}
	if len(r.Runs) > 0 {
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nlost %d, duplicated %d (baseline); lost %d, duplicated %d (ledger); lost %d, duplicated %d (no ledger)\n",
		r.Baseline.Lost, r.Baseline.Duplicates, r.Ledger.Lost, r.Ledger.Duplicates, r.NoLedger.Lost, r.NoLedger.Duplicates)
	if r.BaselineStalls > 0 {
		fmt.Fprintf(w, "the baseline stalled %d time(s) in nats.go's Consume (nats-io/nats.go#1622) and was measured again\n", r.BaselineStalls)
	}
	for _, m := range []struct {
		name string
		res  queue.BenchResult
	}{{"baseline", r.Baseline}, {"ledger", r.Ledger}, {"no ledger", r.NoLedger}} {
		if m.res.Stalled() {
			fmt.Fprintf(w, "warning: %s handled no job for %.0fs at a stretch; its figures include that stall\n", m.name, m.res.LongestPauseS)
		}
	}
}

// ---- version, completion ----------------------------------------------

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version of jobq and its parts",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return badUsage("version takes no arguments")
			}
			v := map[string]string{"version": version, "commit": commit, "go": runtime.Version(), "nats_server": depVersion("github.com/nats-io/nats-server/v2"), "nats_go": depVersion("github.com/nats-io/nats.go")}
			if c.Bool("json") {
				return printJSON(c.App.Writer, v)
			}
			fmt.Fprintf(c.App.Writer, "jobq %s (commit %s, %s, nats-server %s, nats.go %s)\n", v["version"], v["commit"], v["go"], v["nats_server"], v["nats_go"])
			return nil
		},
	}
}

func depVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == path {
				return d.Version
			}
		}
	}
	return "unknown"
}

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script: bash, zsh or fish",
		ArgsUsage: "bash|zsh|fish",
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return badUsage("completion takes one shell: bash, zsh or fish")
			}
			switch c.Args().First() {
			case "bash":
				fmt.Fprint(c.App.Writer, bashCompletion)
			case "zsh":
				fmt.Fprint(c.App.Writer, zshCompletion)
			case "fish":
				s, err := c.App.ToFishCompletion()
				if err != nil {
					return err
				}
				fmt.Fprint(c.App.Writer, s)
			default:
				return badUsage("completion takes bash, zsh or fish")
			}
			return nil
		},
	}
}

const bashCompletion = `_jobq_complete() {
  local cur words
  cur="${COMP_WORDS[COMP_CWORD]}"
  words=$("${COMP_WORDS[0]}" "${COMP_WORDS[@]:1:$COMP_CWORD-1}" --generate-bash-completion 2>/dev/null)
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _jobq_complete jobq
`

const zshCompletion = `#compdef jobq
_jobq() {
  local -a opts
  opts=("${(@f)$(${words[1]} ${words[@]:1:$CURRENT-2} --generate-bash-completion 2>/dev/null)}")
  _describe 'values' opts
}
compdef _jobq jobq
`
